"""import -> export -> import is identity, for every format, on files shaped like the frameworks' own.

Three properties per example file:
1. writing the knobs it was read with changes nothing (byte for byte);
2. writing changed knobs gives a file that reads back with exactly those knobs, and touches only
   the lines of the keys that changed (every other line is kept, comments included);
3. writing the original knobs back restores the original knobs (the text may differ where the
   original said "auto" or left a key to its default).
"""
from pathlib import Path

import pytest
import yaml

from memfit.interfaces.formats import diff, read_config, write_config_files
from memfit.interfaces.formats.base import WrittenFile

from format_cases import CASES, EXAMPLES

def _save(files: list[WrittenFile], folder: Path) -> None:
    for f in files:
        path = f.path if f.path.is_absolute() else folder / f.path
        path.write_text(f.new_text)


def test_every_example_file_is_covered():
    on_disk = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.is_file()}
    companions = {p for p in on_disk if p.endswith(".json") and ("ds_z" in p or "ds_config_zero2" in p
                                                                 or "ds_zero3" in p)}
    assert on_disk - companions <= set(CASES), on_disk - companions - set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_unchanged_knobs_write_the_same_bytes(examples, name):
    options, _ = CASES[name]
    imported = read_config(examples / name, **options)
    files = write_config_files(imported, dict(imported.knobs))
    assert [f.new_text for f in files] == [f.old_text for f in files]
    assert diff(files) == ""


@pytest.mark.parametrize("name", sorted(CASES))
def test_changed_knobs_read_back_and_restore(examples, name):
    options, changes = CASES[name]
    path = examples / name
    original = read_config(path, **options)
    files = write_config_files(original, {**original.knobs, **changes})
    assert any(f.changed for f in files)
    _save(files, path.parent)
    changed = read_config(path, **options)
    for knob, value in changes.items():
        got = changed.knobs.get(knob)
        assert got == value or (value is None and knob not in changed.knobs), (knob, got, value)
    for knob, value in original.knobs.items():  # nothing else moved (derived knobs excepted)
        if knob not in changes and knob not in DERIVED:
            assert changed.knobs.get(knob) == value, (knob, changed.knobs.get(knob), value)
    # only the changed keys' lines differ: every line of the old file not in the diff is kept
    for f in files:
        if f.old_text is not None:
            old_lines, new_lines = f.old_text.splitlines(), f.new_text.splitlines()
            assert len(set(old_lines) - set(new_lines)) <= len(changes) + 2
    back = write_config_files(changed, {**{k: None for k in changed.knobs}, **original.knobs})
    _save(back, path.parent)
    restored = read_config(path, **options)
    assert restored.knobs == original.knobs


# knobs that follow others (OpenRLHF: overlap_comm follows the ZeRO stage unless forced, the
# accumulation follows the global batch; LoRA settings vanish with full tuning; ...)
DERIVED = {"overlap_comm", "grad_accum", "lora_alpha", "offload_param", "pin_memory", "zero3_init", "double_quant", "quant_bits",
           "lora_rank", "lora_targets", "lora_dropout", "dora"}


def test_write_config_accepts_only_the_changes(examples):
    imported = read_config(examples / "llamafactory/examples/train_lora/llama3_lora_sft.yaml")
    full = write_config_files(imported, {**imported.knobs, "micro_batch": 2})
    only = write_config_files(imported, {"micro_batch": 2})
    assert full[0].new_text == only[0].new_text
    assert "-per_device_train_batch_size: 1\n+per_device_train_batch_size: 2\n" in diff(full)


def test_comments_and_order_are_kept(examples):
    path = examples / "llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml"
    imported = read_config(path)
    new = write_config_files(imported, {"micro_batch": 2, "zero_stage": 2})
    text = new[0].new_text
    assert "report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]" in text
    assert "# eval_steps: 500" in text
    keys = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith("#")]
    old = [line.split(":")[0] for line in imported.text.splitlines() if line and not line.startswith("#")]
    assert keys == old
    ds_file = new[1]
    assert ds_file.path.name == "ds_z3_config.json"
    assert '"stage": 2' in ds_file.new_text and '"sub_group_size": 1e9' in ds_file.new_text  # 1e9 kept as written


def test_a_new_deepspeed_file_for_a_ddp_yaml(examples):
    path = examples / "llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml"
    imported = read_config(path, gpus=7)
    files = write_config_files(imported, {"zero_stage": 3, "offload_optimizer": "cpu"})
    assert files[1].old_text is None and files[1].path.name == "ds_z3_offload_config.json"
    # LLaMA-Factory opens `deepspeed:` from the working directory, not from the YAML's folder
    value = yaml.safe_load(files[0].new_text)["deepspeed"]
    assert (Path.cwd() / value).resolve() == files[1].path.resolve()
    assert "/dev/null" in diff(files)


def test_openrlhf_writes_in_the_files_flag_style(examples):
    legacy = read_config(examples / "openrlhf/train_sft_llama_v0.8.sh")
    dotted = read_config(examples / "openrlhf/train_sft_v0.11.sh")
    assert legacy.variant == "0.8.9" and dotted.variant == "0.11.2"
    old = write_config_files(legacy, {"offload_optimizer": "cpu", "zero_stage": 3})[0].new_text
    new = write_config_files(dotted, {"offload_optimizer": "cpu", "zero_stage": 3})[0].new_text
    assert "   --zero_stage 3 \\\n" in old and "--adam_offload" in old and "--ds." not in old
    assert "   --ds.zero_stage 3 \\\n" in new and "--ds.adam_offload" in new
    assert old.rstrip().endswith("fi") and "--gradient_checkpointing \\\n   --adam_offload\nEOF" in old


def test_openrlhf_detects_each_flag_style():
    from memfit.interfaces.formats import openrlhf_command

    assert openrlhf_command.detect_version("train_sft", ["--flash_attn", "--bf16"])[0] == "0.8.9"
    assert openrlhf_command.detect_version("train_sft", ["--bf16", "--attn_implementation"])[0] == "0.9.1"
    assert openrlhf_command.detect_version("train_sft", ["--param_dtype"])[0] == "0.10.1"
    assert openrlhf_command.detect_version("train_sft", ["--ds.zero_stage"])[0] == "0.11.2"


def test_openrlhf_global_batch_sets_accumulation(examples):
    four = read_config(examples / "openrlhf/qwen2_7b_4x4090_z3.sh")  # deepspeed --num_gpus 4
    assert four.world["num_gpus"] == 4 and four.knobs["grad_accum"] == 64 // (4 * 4)
    eight = read_config(examples / "openrlhf/qwen2_7b_4x4090_z3.sh", gpus=8)
    assert eight.knobs["grad_accum"] == 2


def test_deepspeed_auto_values_stay_out_of_the_knobs(examples):
    imported = read_config(examples / "llamafactory/examples/deepspeed/ds_z3_config.json")
    for knob in ("reduce_bucket_size", "prefetch_bucket_size", "param_persistence_threshold", "micro_batch"):
        assert knob not in imported.knobs  # "auto": filled by the profile's rule in build_scenario


SCENARIOS = [
    dict(model="llama-3.1-8b-instruct", gpus=7, profile="llamafactory", tuning="lora", lora_rank=16,
         micro_batch=4, seq_len=2048, zero_stage=3, checkpointing="full"),
    dict(model="qwen2-7b-instruct", gpus=4, profile="openrlhf", tuning="full", zero_stage=3,
         offload_optimizer="cpu", micro_batch=4, seq_len=128, checkpointing="full", attention="flash"),
    dict(model="qwen2-7b-instruct", gpus=8, profile="trl", tuning="lora", lora_rank=32, micro_batch=2,
         seq_len=4096, checkpointing="full", attention="flash"),
]
FORMATS_FOR = {"llamafactory": ["llamafactory", "deepspeed", "accelerate"], "openrlhf": ["openrlhf"],
               "trl": ["hf"]}


@pytest.mark.parametrize("index", range(len(SCENARIOS)))
def test_export_from_scenario_reads_back(scenario, tmp_path, index):
    from memfit.interfaces.formats import export_scenario, knobs_from_scenario

    spec = dict(SCENARIOS[index])
    s = scenario(**spec)
    for fmt in FORMATS_FOR[spec["profile"]]:
        files = export_scenario(s, fmt)
        for f in files[1:]:
            (tmp_path / f.path).write_text(f.new_text)
        main = tmp_path / ("main" + {"llamafactory": ".yaml", "accelerate": ".yaml", "hf": ".yaml",
                                     "deepspeed": ".json", "openrlhf": ".sh"}[fmt])
        main.write_text(files[0].new_text)
        back = read_config(main, format=fmt, gpus=s.world_size)
        wanted = knobs_from_scenario(s)
        for knob, value in back.knobs.items():
            if knob in wanted and knob not in ("overlap_comm", "pin_memory", "lora_alpha"):
                assert value == wanted[knob], (fmt, knob, value, wanted[knob])


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_example_builds_a_scenario(name):
    """The knobs an importer produces are ones profiles.build_scenario accepts, with the file's profile."""
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.errors import MemfitError
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware
    options, _ = CASES[name]
    imported = read_config(EXAMPLES / name, **options)
    try:
        model = find_model(imported.model_name or "llama-3.1-8b-instruct")
    except MemfitError:
        model = find_model("llama-3.1-8b-instruct")
    hardware = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=imported.world.get("num_gpus") or 8)
    scenario = build_scenario(model, hardware, imported.knobs, imported.profile)
    assert scenario.micro_batch == imported.knobs.get("micro_batch", 1)
