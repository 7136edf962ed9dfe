"""What memfit writes, checked by the frameworks' own code (memfit/interfaces/formats/validate.py).

Needs, per test (each skips when its framework is missing):
- deepspeed, transformers + trl, accelerate: `pip install -e ".[validate]"` (see pyproject.toml);
- OpenRLHF: the released wheels, fetched with `pip download --no-deps` (no install: it imports flash_attn);
- LLaMA-Factory: its own virtual environment at .venvs/llamafactory (tests/formats/README.md).
"""
import json
from pathlib import Path

import pytest

from memfit.interfaces.formats import read_config, write_config_files
from memfit.interfaces.formats import openrlhf as orl
from memfit.interfaces.formats import openrlhf_command as orl_command
from memfit.interfaces.formats import validate
from memfit.interfaces.formats import validate_openrlhf
from memfit.interfaces.formats.tables import table

from format_cases import CASES, EXAMPLES


def _cases(prefix):
    return sorted(name for name in CASES if name.startswith(prefix))


def _written(examples, name):
    """(imported, [file texts]) for the file as it is and after the CASES change, saved to disk."""
    options, changes = CASES[name]
    path = examples / name
    original = read_config(path, **options)
    files = write_config_files(original, {**original.knobs, **changes})
    for f in files:
        (f.path if f.path.is_absolute() else path.parent / f.path).write_text(f.new_text)
    return original, read_config(path, **options)


def _zero_matches(zero, knobs):
    assert zero.stage == knobs["zero_stage"]
    assert (zero.offload_optimizer.device if zero.offload_optimizer else "none") == knobs["offload_optimizer"]
    assert (zero.offload_param.device if zero.offload_param else "none") == knobs["offload_param"]
    if "pin_memory" in knobs and knobs["offload_optimizer"] != "none":
        assert zero.offload_optimizer.pin_memory == knobs["pin_memory"]
    if "ratio" in knobs:
        assert zero.offload_optimizer.ratio == knobs["ratio"]
    if "reduce_bucket_size" in knobs:
        assert zero.reduce_bucket_size == knobs["reduce_bucket_size"]


# --- the stored key tables are the frameworks' ---------------------------------------------------

def _same_table(stored, derived):
    stored = {k: v for k, v in stored.items() if k != "source"}
    derived = {k: v for k, v in derived.items() if k != "source"}
    assert json.loads(json.dumps(derived)) == stored


def test_deepspeed_table_is_deepspeeds():
    pytest.importorskip("deepspeed")
    _same_table(table("deepspeed"), validate.deepspeed_table())


def test_hf_table_is_transformers_and_trls():
    pytest.importorskip("trl")
    _same_table(table("hf"), validate.hf_table())


def test_accelerate_table_is_accelerates():
    pytest.importorskip("accelerate")
    _same_table(table("accelerate"), validate.accelerate_table())


@pytest.fixture(scope="module")
def openrlhf_wheels():
    try:
        for version in validate_openrlhf.OPENRLHF_VERSIONS:
            validate_openrlhf.openrlhf_source(version, "train_sft")
    except Exception as e:  # no network to the package index
        pytest.skip(f"cannot fetch the OpenRLHF wheels: {e}")


def test_openrlhf_tables_are_the_releases_parsers(openrlhf_wheels):
    _same_table(table("openrlhf"), validate_openrlhf.openrlhf_table())


@pytest.fixture(scope="module")
def llamafactory_venv():
    if not (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():
        pytest.skip(f"no LLaMA-Factory venv at {validate.LLAMAFACTORY_VENV} (tests/formats/README.md)")


def test_llamafactory_table_is_llamafactorys(llamafactory_venv):
    _same_table(table("llamafactory"), validate.llamafactory_table())


# --- written files pass the frameworks' parsers ----------------------------------------------------

@pytest.mark.parametrize("name", _cases("deepspeed/") + _cases("llamafactory/examples/deepspeed/")
                         + ["accelerate/ds_zero3_offload.json", "hf/ds_config_zero2.json"])
def test_deepspeed_accepts_what_we_write(examples, name):
    pytest.importorskip("deepspeed")
    if name not in CASES:
        imported = read_config(examples / name)
        config = validate.validate_deepspeed(imported.text)
        _zero_matches(config.zero_config, imported.knobs)
        return
    for imported in _written(examples, name):
        config = validate.validate_deepspeed(imported.text, world_size=imported.world.get("num_gpus", 1))
        _zero_matches(config.zero_config, imported.knobs)
        if "micro_batch" in imported.knobs:
            assert config.train_micro_batch_size_per_gpu == imported.knobs["micro_batch"]


@pytest.mark.parametrize("name", _cases("llamafactory/examples/train") + _cases("accelerate/") + _cases("hf/"))
def test_deepspeed_accepts_the_companion_files(examples, name):
    pytest.importorskip("deepspeed")
    for imported in _written(examples, name):
        for companion in imported.companions.values():
            _zero_matches(validate.validate_deepspeed(companion.text).zero_config, companion.knobs)


@pytest.mark.parametrize("name", _cases("hf/"))
def test_transformers_and_trl_accept_what_we_write(examples, name):
    pytest.importorskip("trl")
    for imported in _written(examples, name):
        variant = imported.variant.split(":")[0]
        parsed = validate.validate_hf(imported.text, variant)
        args = parsed[0] if variant == "training_args" else parsed[1]
        assert args.per_device_train_batch_size == imported.knobs["micro_batch"]
        assert args.gradient_accumulation_steps == imported.knobs["grad_accum"]
        assert bool(args.gradient_checkpointing) == (imported.knobs["checkpointing"] == "full") or \
            imported.knobs.get("engine") == "fsdp"
        if variant != "training_args":
            assert args.max_length == imported.knobs["seq_len"]
            model = parsed[2]
            assert model.use_peft == (imported.knobs["tuning"] in ("lora", "qlora"))


@pytest.mark.parametrize("name", _cases("accelerate/"))
def test_accelerate_accepts_what_we_write(examples, name):
    pytest.importorskip("accelerate")
    for imported in _written(examples, name):
        config = validate.validate_accelerate(imported.text)
        assert config.distributed_type.value == {"deepspeed": "DEEPSPEED", "fsdp": "FSDP", "ddp": "MULTI_GPU",
                                                 "single": "NO"}[imported.knobs["engine"]]
        if imported.knobs["engine"] == "deepspeed" and not imported.companions:
            assert config.deepspeed_config["zero_stage"] == imported.knobs["zero_stage"]


@pytest.mark.parametrize("name", _cases("openrlhf/"))
def test_openrlhf_argparse_accepts_what_we_write(examples, name, openrlhf_wheels):
    for imported in _written(examples, name):
        version, script = imported.variant, imported.doc.script
        args = vars(validate_openrlhf.validate_openrlhf(orl.arguments(imported), version, script))
        dest = lambda knob: orl_command.flags_of(version, script)[orl_command.flag_name(version, script, knob)]["dest"]  # noqa: E731
        assert args[dest("zero_stage")] == imported.knobs["zero_stage"]
        assert args[dest("micro_batch")] == imported.knobs["micro_batch"]
        assert args[dest("seq_len")] == imported.knobs["seq_len"]
        assert args[dest("adam_offload")] == (imported.knobs["offload_optimizer"] == "cpu")
        assert (args[dest("lora_rank")] > 0) == (imported.knobs["tuning"] in ("lora", "qlora"))
        if "ref_offload" in imported.knobs:  # train_dpo
            assert args[dest("ref_offload")] == imported.knobs["ref_offload"]


def test_openrlhf_argparse_rejects_a_wrong_flag(openrlhf_wheels):
    with pytest.raises(validate.ValidationFailed, match="unrecognized"):
        validate_openrlhf.validate_openrlhf(["--zero_stage", "3", "--adam_ofload"], "0.10.1")


def test_deepspeed_rejects_partial_offload_outside_zero3():
    pytest.importorskip("deepspeed")
    bad = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}
    with pytest.raises(validate.ValidationFailed, match="Partial offloading"):
        validate.validate_deepspeed(json.dumps(bad))


LLAMAFACTORY_CASES = ["llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml",
                      "llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml"]


@pytest.mark.parametrize("name", LLAMAFACTORY_CASES)
def test_llamafactory_accepts_what_we_write(examples, name, llamafactory_venv):
    """LLaMA-Factory's get_train_args under torchrun, run from the folder the `deepspeed:` path is
    relative to (about 15 s a call: it imports transformers, peft and trl)."""
    from memfit.interfaces.formats.llamafactory import resolve_deepspeed

    for imported in _written(examples, name)[1:]:  # the rewritten file (the original is the same shape)
        base = imported.path.parent
        if imported.doc.get("deepspeed"):
            found = resolve_deepspeed(imported.doc["deepspeed"], imported.path, "test")
            base = Path(str(found.resolve())[: -len(imported.doc["deepspeed"])])
        parsed = validate.validate_llamafactory(imported.text, base_dir=base)
        assert parsed["per_device_train_batch_size"] == imported.knobs["micro_batch"]
        assert parsed["gradient_accumulation_steps"] == imported.knobs["grad_accum"]
        assert parsed["lora_rank"] == imported.knobs["lora_rank"]
        assert parsed["disable_gradient_checkpointing"] == (imported.knobs["checkpointing"] == "off")
        assert (parsed["deepspeed"] is not None) == (imported.knobs.get("engine") == "deepspeed")


def test_llamafactory_rejects_an_unknown_key(tmp_path, llamafactory_venv):
    text = (EXAMPLES / "llamafactory/examples/train_lora/llama3_lora_sft.yaml").read_text()
    with pytest.raises(validate.ValidationFailed):
        validate.validate_llamafactory(text + "gradient_checkpointing_disable: true\n", base_dir=tmp_path)


# --- code edits: knobs OpenRLHF has no flag for, set in get_train_ds_config -----------------------------

DS_UTILS = "openrlhf/utils/deepspeed/deepspeed_utils.py"


def _planned_code_edits():
    """The code edits memfit plans for the 72B host OOM (report-qwen25-72b-offload-pinned): a fresh start."""
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.planner.plan import Options, plan
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    hw = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=8, host_ram=1_400_000_000_000)
    base = build_scenario(find_model("Qwen/Qwen2.5-72B-Instruct"), hw,
                          {"zero_stage": 3, "offload_optimizer": "cpu", "micro_batch": 1, "seq_len": 2048,
                           "checkpointing": "full"}, "openrlhf")
    rows = plan(base, set(), None, top_k=10, options=Options(resume=False))
    return [c.code_edit for r in rows for c in r.changes if c.code_edit]


def _catalog_code_edits():
    """Every assignment data/frameworks/openrlhf.toml [plan.code_edits] knows for OpenRLHF, with the values of the reported fixes."""
    from memfit.planner.changes import CodeEdit
    from memfit.planner.space import framework_options

    where = framework_options()["openrlhf"]["code_edits"]
    values = {"pin_memory": False, "ratio": 0.9, "sub_group_size": 100_000_000}
    return [CodeEdit(where["file"], where["function"], tuple((where[k], v) for k, v in values.items()))]


@pytest.mark.parametrize("version", validate_openrlhf.OPENRLHF_VERSIONS)
def test_deepspeed_accepts_the_code_edits_applied_to_openrlhfs_get_train_ds_config(version, openrlhf_wheels):
    pytest.importorskip("deepspeed")
    edits = _planned_code_edits()
    assert edits
    edits += _catalog_code_edits()
    source = validate_openrlhf.openrlhf_file(version, DS_UTILS)

    def deepspeed_sees(text: str):
        config = validate_openrlhf.openrlhf_train_ds_config(text, offload=False, adam_offload=True, stage=3)
        # OpenRLHF's strategy adds the batch sizes before deepspeed.initialize (micro 1 x 8 steps x 8 GPUs)
        config |= {"train_micro_batch_size_per_gpu": 1, "train_batch_size": 64}
        return validate.validate_deepspeed(json.dumps(config), world_size=8).zero_config

    assert deepspeed_sees(source).offload_optimizer.pin_memory is True  # the hard-coded value edits change
    for edit in edits:
        zero = deepspeed_sees(orl.edit_function(source, edit.function, edit.lines()))
        for target, value in edit.assignments:
            key = target.rsplit('["', 1)[1].rstrip('"]')
            got = getattr(zero.offload_optimizer, key) if "offload_optimizer" in target else getattr(zero, key)
            assert got == value, (target, got)


def test_llamafactory_accepts_the_qlora_file_we_write_from_a_lora_one(tmp_path, llamafactory_venv):
    """`fit --allow qlora` on a LoRA YAML: the QLoRA file reads back as QLoRA with LLaMA-Factory's own default of
    double quantization (unstated, it is on) and LLaMA-Factory's parser accepts it."""
    from memfit.interfaces.formats import read_config, write_config_files

    source = tmp_path / "llama3_lora_sft.yaml"
    source.write_text((EXAMPLES / "llamafactory/examples/train_lora/llama3_lora_sft.yaml").read_text())
    imported = read_config(source, gpus=1)
    assert imported.knobs["tuning"] == "lora"
    for double in (True, False):
        written = write_config_files(imported, {**imported.knobs, "tuning": "qlora", "double_quant": double})
        text = written[0].new_text
        again = read_config(text, format="llamafactory", gpus=1).knobs
        assert (again["tuning"], again["quant_bits"], again["double_quant"]) == ("qlora", 4, double)
        parsed = validate.validate_llamafactory(text, base_dir=tmp_path)
        assert parsed["quantization_bit"] == 4 and parsed["double_quantization"] is double
