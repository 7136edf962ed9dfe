"""LLaMA-Factory v1 YAML (issue 12 item 1): detected, read onto memfit's knobs, checked against v1's own argument
dataclasses and parser in the LLaMA-Factory virtual environment (tests/formats/README.md; those tests skip
without it)."""
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

import cards
from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import detect_format, read_config, write_config_files
from memfit.interfaces.formats import llamafactory, validate
from memfit.interfaces.formats.tables import table
from memfit.interfaces.formats.yamltext import yaml

HERE = Path(__file__).parent / "llamafactory_v1_examples"
EXAMPLES = sorted(p.name for p in HERE.glob("*.yaml"))
V0 = Path(__file__).parent / "examples" / "llamafactory" / "examples"


@pytest.fixture(scope="module")
def venv():
    if not (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():
        pytest.skip(f"no LLaMA-Factory venv at {validate.LLAMAFACTORY_VENV} (tests/formats/README.md)")
    from memfit.interfaces.formats import validate_llamafactory_v1
    return validate_llamafactory_v1


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _read(text: str, gpus: int = 8):
    return read_config(text, format="llamafactory", gpus=gpus)


BASE = "model: Qwen/Qwen3-0.6B\ntrain_dataset: data/v1_sft_demo.yaml\n"


def test_examples_name_their_source_and_are_read_as_v1():
    assert len(EXAMPLES) >= 3
    for name in EXAMPLES:
        text = (HERE / name).read_text()
        assert "github.com/hiyouga/LLaMA-Factory examples/v1/" in text and "commit" in text, name
        assert detect_format(text, name) == "llamafactory"
        assert read_config(HERE / name, gpus=8).variant == "v1"
    for path in V0.rglob("*.yaml"):  # v0 files keep the v0 reader
        assert read_config(path, gpus=8).variant is None, path


def test_the_key_table_is_the_installed_v1_dataclasses(venv):
    stored = {k: v for k, v in table("llamafactory_v1").items() if k != "source"}
    derived = {k: v for k, v in venv.llamafactory_v1_table().items() if k != "source"}
    assert json.loads(json.dumps(derived)) == stored


@pytest.fixture(scope="module")
def parsed_examples(venv):
    """v1's own parser over every example, in one process (LLaMA-Factory's import is ~10 s a process)."""
    docs = [yaml.safe_load((HERE / name).read_text()) for name in EXAMPLES] + [UNKNOWN_KEY]
    return dict(zip([*EXAMPLES, "unknown key"], venv.validate_many(docs)))


UNKNOWN_KEY = {"model": "Qwen/Qwen3-0.6B", "micro_batch_size": 1, "cutof_len": 1024}


@pytest.mark.parametrize("name", EXAMPLES)
def test_v1s_own_parser_accepts_each_example_and_agrees_with_memfit(name, parsed_examples, monkeypatch):
    monkeypatch.chdir(HERE)  # config_file paths resolve from the working directory, as in a run
    parsed = parsed_examples[name]
    assert not isinstance(parsed, Exception), parsed
    model, training = parsed["model"], parsed["training"]
    k = read_config(HERE / name, gpus=8).knobs
    assert k["micro_batch"] == training["micro_batch_size"] and k["seq_len"] == training["cutoff_len"]
    assert k["checkpointing"] == ("full" if training["enable_activation_checkpointing"] else "off")
    assert k["attention"] == {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash"}[model["flash_attn"]]
    assert k["padding"] == ("padding_free" if "padding_free" in training["batching_strategy"] else "padded")
    peft = model["peft_config"] or {}
    if peft.get("name") == "lora":
        assert k["lora_rank"] == peft.get("r", 8) and k["lora_alpha"] == peft.get("lora_alpha", 16)
    assert k["engine"] == {"fsdp2": "fsdp", "deepspeed": "deepspeed"}[training["dist_config"]["name"]]


def test_v1s_parser_and_memfit_both_refuse_an_unknown_key(parsed_examples):
    from memfit.interfaces.formats.framework_tables import ValidationFailed
    refused = parsed_examples["unknown key"]
    assert isinstance(refused, ValidationFailed) and "cutof_len" in str(refused)
    with pytest.raises(MemfitError, match="did you mean 'cutoff_len'") as e:
        _read(yaml.safe_dump(UNKNOWN_KEY))
    assert "\n" not in str(e.value)


def test_precision_and_engine_follow_v1s_code():
    full, lora = BASE + "micro_batch_size: 1\n", BASE + "micro_batch_size: 1\npeft_config: {name: lora}\n"
    # no dist_config: no autocast in v1's loop; full tuning upcasts the model to fp32
    assert (_read(full).knobs["engine"], _read(full).knobs["precision"]) == ("ddp", "fp32")
    assert (_read(full, gpus=1).knobs["engine"], _read(lora).knobs["precision"]) == ("single", "bf16-pure")
    fsdp = full + "dist_config: {name: fsdp2, reshard_after_forward: false, offload_params: true}\n"
    k = _read(fsdp).knobs
    assert (k["engine"], k["fsdp_strategy"], k["fsdp_cpu_offload"], k["precision"]) == \
           ("fsdp", "shard_grad_op", True, "bf16-mixed")
    assert _read(fsdp + "bf16: false\n").knobs["precision"] == "fp32"


def test_plugins_map_or_fail_in_one_line():
    k = _read(BASE + "peft_config: {name: lora, r: 32, use_dora: true}\nquant_config: {name: bnb, quantization_bit: 4}\n"
              "dist_config: {name: fsdp2}\nbatching_strategy: dynamic_padding_free\n").knobs
    assert (k["tuning"], k["lora_rank"], k["dora"], k["padding"]) == ("qlora", 32, True, "padding_free")
    for text, match in (("dist_config: {name: fsdpturbo, ep_size: 16}\n", "fsdpturbo"),
                        ("peft_config: {r: 8}\n", "needs a `name`"), ("peft_config: {name: ia3}\n", "lora and freeze"),
                        ("micro_batch_size: lots\n", "micro_batch_size"),
                        # v1's peft plugin wraps a string as one module name: "q_proj,v_proj" matches no module
                        ("peft_config: {name: lora, target_modules: 'q_proj,v_proj'}\n", "one module name"),
                        ("peft_config: {name: lora, lora_dropout: [0.1]}\n", "lora_dropout: expected a number")):
        with pytest.raises(MemfitError, match=match) as e:
            _read(BASE + text)
        assert "\n" not in str(e.value)


def _on(label: str) -> str:
    key = label.split(".")[0]
    if label.endswith(".name"):
        return f"{key}: {{name: somename}}\n"
    spec = table("llamafactory_v1")["ModelArguments"].get(key) or table("llamafactory_v1")["TrainingArguments"][key]
    value = [c for c in spec.get("choices", []) if c != spec["default"]][:1] or [not spec["default"]]
    return f"{key}: {json.dumps(value[0])}\n"


@pytest.mark.parametrize("label", [k for k in table("not_modelled")["llamafactory_v1"] if not k.startswith("_")])
def test_each_not_modelled_key_is_named_with_the_direction_of_the_error(label):
    assert label.split(".")[0] in {k for c, t in table("llamafactory_v1").items() if c != "source" for k in t}
    quiet = _read(BASE)
    assert not [w for w in quiet.warnings if "not modelled" in w]
    named = [w for w in _read(BASE + _on(label)).warnings if f"{label}=" in w and "not modelled" in w]
    assert len(named) == 1 and ("too high" in named[0] or "too low" in named[0].lower()), named


def test_unchanged_knobs_write_the_same_bytes():
    for name in EXAMPLES:
        imported = read_config(HERE / name, gpus=8)
        files = write_config_files(imported, dict(imported.knobs))
        assert [f.new_text for f in files] == [imported.text], name


# one change each, as the knob table's `says` column gives llamafactory_v1; each must read back as written
WRITES = [
    ("lora_sft_fsdp2.yaml", {"micro_batch": 2, "grad_accum": 4}), ("lora_sft_fsdp2.yaml", {"seq_len": 4096}),
    ("lora_sft_fsdp2.yaml", {"lora_rank": 64, "lora_alpha": 128, "lora_dropout": 0.0, "dora": True}),
    ("lora_sft_fsdp2.yaml", {"lora_targets": ("q_proj", "v_proj")}), ("lora_sft_fsdp2.yaml", {"tuning": "qlora"}),
    ("lora_sft_fsdp2.yaml", {"tuning": "full", "precision": "bf16-mixed"}),
    ("qlora_fsdp2.yaml", {"tuning": "lora"}), ("qlora_fsdp2.yaml", {"double_quant": False}),
    ("freeze_sft.yaml", {"freeze_trainable_layers": 4}), ("freeze_sft.yaml", {"tuning": "lora", "lora_rank": 8}),
    ("full_fsdp2_padding_free.yaml", {"padding": "padded", "attention": "sdpa", "checkpointing": "off"}),
    ("full_fsdp2_padding_free.yaml", {"fsdp_strategy": "shard_grad_op", "fsdp_cpu_offload": True}),
    ("full_fsdp2_padding_free.yaml", {"precision": "fp32"}),
    ("full_fsdp2_padding_free.yaml", {"engine": "deepspeed", "zero_stage": 2}),
    ("full_deepspeed_z3.yaml", {"zero_stage": 2, "offload_optimizer": "cpu"}),
    ("full_deepspeed_z3.yaml", {"engine": "fsdp", "fsdp_strategy": "full_shard", "fsdp_cpu_offload": False}),
    ("lora_sft_fsdp2.yaml", {"engine": "ddp", "precision": "bf16-pure"}),
]


@pytest.mark.parametrize("name, changes", WRITES, ids=[f"{n}-{'-'.join(c)}" for n, c in WRITES])
def test_a_change_reads_back_as_written(name, changes, tmp_path, monkeypatch):
    monkeypatch.chdir(HERE)  # config_file paths resolve from the working directory, as in a run
    imported = read_config(Path(name), gpus=8)
    files = write_config_files(imported, {**imported.knobs, **changes}, folder=tmp_path)
    again = llamafactory.read(files[0].new_text, gpus=8, files={f.path: f.new_text for f in files[1:]},
                              path=HERE / name)
    assert {k: again.knobs.get(k) for k in changes} == changes
    untouched = {k: v for k, v in imported.knobs.items() if k not in changes and k in again.knobs}
    assert all(again.knobs[k] == v for k, v in untouched.items()
               if k not in ("precision", "fsdp_strategy", "fsdp_cpu_offload") or "engine" not in changes), again.knobs


@pytest.mark.parametrize("name, changes, says", [
    ("lora_sft_fsdp2.yaml", {"padding": "packed"}, "does not pack"),
    ("lora_sft_fsdp2.yaml", {"optimizer": "adamw-8bit"}, "AdamW"),
    ("lora_sft_fsdp2.yaml", {"loss": "liger"}, "standard cross entropy"),
    ("lora_sft_fsdp2.yaml", {"checkpointing": "unsloth"}, "every layer or none"),
    ("lora_sft_fsdp2.yaml", {"tuning": "qlora", "quant_bits": 8}, "4-bit"),
    ("lora_sft_fsdp2.yaml", {"fsdp_strategy": "hybrid_shard"}, "shard_grad_op"),
    ("lora_sft_fsdp2.yaml", {"engine": "single"}, "bf16 mixed precision needs fsdp2 or DeepSpeed"),
    ("lora_sft_fsdp2.yaml", {"tuning": "ia3"}, "LoRA, QLoRA or freeze"),
    ("full_fsdp2_padding_free.yaml", {"lora_rank": 32}, "no peft_config"),
    ("full_deepspeed_z3.yaml", {"fsdp_cpu_offload": True}, "no dist_config"),
])
def test_what_v1_cannot_say_is_one_line(name, changes, says, monkeypatch):
    monkeypatch.chdir(HERE)
    imported = read_config(Path(name), gpus=8)
    with pytest.raises(MemfitError, match=says) as err:
        write_config_files(imported, {**imported.knobs, **changes})
    assert "\n" not in str(err.value)


def test_an_accumulation_needs_the_gpu_count():
    imported = read_config(HERE / "lora_sft_fsdp2.yaml")
    with pytest.raises(MemfitError, match="global_batch_size.*--gpus") as err:
        write_config_files(imported, {**imported.knobs, "micro_batch": 1, "grad_accum": 2})
    assert "\n" not in str(err.value)
    assert "global_batch_size" not in write_config_files(imported, {**imported.knobs, "micro_batch": 2})[0].new_text


# each example where it does not fit: fit writes what re-reads to the plan. The hardware is a real card where a plan
# fits (change None), or a card derived from memfit's own verdict (tests/cards.py): the smallest on which `change`,
# a plan the file can say, fits and neither the file as written nor any change of `not_enough` does, so each row
# keeps its plan as the error bands move
ZERO3_OFFLOAD = {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}
FITS = [("lora_sft_fsdp2.yaml", [], {"tuning": "qlora"}, (), ["--allow", "qlora"]),  # writes a quant_config block
        # fsdp2 -> DeepSpeed: writes the JSON the new dist_config names (FSDP2's own offload does not fit there)
        ("freeze_sft.yaml", [], ZERO3_OFFLOAD, ({"fsdp_cpu_offload": True},), []),
        ("full_deepspeed_z3.yaml", ["--gpu", "rtx3090", "--gpus", "2"], None, (), []),
        ("qlora_fsdp2.yaml", [], {"micro_batch": 1, "grad_accum": 2}, (), []),  # writes global_batch_size
        ("freeze_sft.yaml", [], {"fsdp_cpu_offload": True}, (), []),  # writes dist_config.offload_params
        ("full_fsdp2_padding_free.yaml", ["--gpu", "rtx4090"], None, (), [])]
PLAN = re.compile(r"-> (fits|tight) \(([\d.]+) GiB")


def _step(imported, gpus: int) -> tuple:
    """What one optimizer step trains on: global batch, padding, length."""
    k = imported.knobs
    return k["micro_batch"] * k.get("grad_accum", 1) * gpus, k["padding"], k["seq_len"]


def _hardware(name: str, hardware: list[str], change: dict | None, not_enough: tuple) -> list[str]:
    """The row's hardware words: on a card derived for `change` (one custom GPU) when the row has one."""
    if change is None:
        return hardware
    run = cards.from_file(name, gpu_mem="80GiB")  # any size: card() sets the capacity
    return cards.gpu_mem(cards.card(run, change, not_enough))


FIT_IDS = [f"{n}-{'-'.join(h + list(c or ()) + e)}" for n, h, c, _, e in FITS]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Each FITS row's `memfit fit` run (its output, the written file, its hardware and GPU count), and v1's own
    parser over every written file in one process, where the LLaMA-Factory venv runs here (else None)."""
    rows = {}
    for row_id, (name, hardware, change, not_enough, extra) in zip(FIT_IDS, FITS):
        folder = tmp_path_factory.mktemp("fit")
        with contextlib.chdir(HERE):
            hardware = _hardware(name, hardware, change, not_enough)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["fit", name, *hardware, *extra, "--out", str(folder)])
        gpus = int(hardware[hardware.index("--gpus") + 1]) if "--gpus" in hardware else 1
        rows[row_id] = {"code": code, "out": out.getvalue(), "written": folder / name, "hardware": hardware,
                        "gpus": gpus, "parsed": None}
    if (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():  # v1's own parser, where it runs here
        from memfit.interfaces.formats import validate_llamafactory_v1

        ok = [r for r in rows.values() if r["code"] == 0]
        for r, parsed in zip(ok, validate_llamafactory_v1.validate_many(
                [yaml.safe_load(r["written"].read_text()) for r in ok])):
            r["parsed"] = parsed
    return rows


@pytest.mark.parametrize("name, hardware, change, not_enough, extra", FITS, ids=FIT_IDS)
def test_fit_writes_what_reads_back_as_the_plan(name, hardware, change, not_enough, extra, fitted, request,
                                                monkeypatch, capsys):
    """(a) the written file estimates as planned, (b) one step trains on the same data, (c) v1's parser takes it."""
    monkeypatch.chdir(HERE)
    row = fitted[request.node.callspec.id]
    out, written, hardware, gpus = row["out"], row["written"], row["hardware"], row["gpus"]
    assert row["code"] == 0 and PLAN.search(out.splitlines()[0]), out
    planned = float(PLAN.search(out).group(2))
    assert main(["estimate", "--from", str(written), *hardware, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] in ("fits", "tight")
    assert abs(doc["per_rank"]["device_total"]["peak_bytes"] / 2**30 - planned) <= max(0.5, 0.02 * planned)
    before, after = read_config(HERE / name, gpus=gpus), read_config(written, gpus=gpus)
    assert after.variant == "v1" and _step(after, gpus) == _step(before, gpus)
    if not_enough:  # the card leaves the plan no other way: the written file says the change
        assert {k: after.knobs.get(k) for k in change} == change, after.knobs
    if row["parsed"] is not None:
        parsed = row["parsed"]
        assert not isinstance(parsed, Exception), parsed
        assert parsed["training"]["micro_batch_size"] == after.knobs["micro_batch"]
        assert parsed["training"]["cutoff_len"] == after.knobs["seq_len"]
    for companion in after.companions.values():  # the DeepSpeed JSON it names, new or edited
        validate.validate_deepspeed(companion.text, world_size=gpus)


def test_v1_says_its_own_column_of_the_knob_table():
    from memfit.facts.knobs import knobs, said_by
    from memfit.interfaces.formats import sayable
    from memfit.interfaces.formats.llamafactory_v1_write import FIXED, LORA_KEYS

    v1 = read_config(HERE / "lora_sft_fsdp2.yaml", gpus=8)
    assert sayable(v1) == said_by("llamafactory_v1") | said_by("deepspeed") != sayable(read_config(
        V0 / "train_lora" / "llama3_lora_sft.yaml", gpus=8))
    says = {name: k.says.get("llamafactory_v1", "") for name, k in knobs().items()}
    assert all(f"peft_config.{key}" in says[knob] for knob, (key, _) in LORA_KEYS.items())
    assert not set(FIXED) & said_by("llamafactory_v1")


def _estimate(capsys, path) -> dict:
    code = main(["estimate", "--from-file", str(path), "--gpu", "a100-80gb", "--gpus-per-node", "8", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_parameter_offload_lowers_the_estimate(tmp_path, capsys):
    text = (HERE / "full_fsdp2_padding_free.yaml").read_text()
    offload = tmp_path / "offload.yaml"
    offload.write_text(text.replace("  name: fsdp2\n", "  name: fsdp2\n  offload_params: true\n"))
    assert offload.read_text() != text
    base, lower = _estimate(capsys, HERE / "full_fsdp2_padding_free.yaml"), _estimate(capsys, offload)
    assert lower["margin_bytes"] > base["margin_bytes"]


def test_a_deepspeed_companion_is_read(capsys):
    imported = read_config(HERE / "full_deepspeed_z3.yaml", gpus=8)
    assert imported.knobs["zero_stage"] == 3 and "deepspeed" in imported.companions
    assert _estimate(capsys, HERE / "full_deepspeed_z3.yaml")["verdict"] in ("fits", "tight", "oom")


def test_a_launch_knows_which_knobs_a_v1_file_states():
    """A launch merges its files by what each states (launch_merge.stated): a v1 file by v1's own keys."""
    from memfit.interfaces.formats.launch_merge import stated

    part = read_config(HERE / "lora_sft_fsdp2.yaml", gpus=2)
    said = {k: stated(part, k) for k in ("micro_batch", "lora_rank", "seq_len", "engine", "checkpointing")}
    assert said == {"micro_batch": True, "lora_rank": True, "seq_len": True, "engine": True, "checkpointing": False}
