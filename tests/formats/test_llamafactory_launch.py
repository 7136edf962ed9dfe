"""Issue 27 item 3: LLaMA-Factory's flag launches are read as LLaMA-Factory (the keys of its YAML), never as a
generic HF script that drops LoRA, 4-bit and the length; keys and values of older releases are read with a warning
naming the release (tables/llamafactory_other_releases.json), never refused."""
import argparse
import json
import shlex
from pathlib import Path

import pytest
import yaml

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import blank_arguments, scenario_and_file
from memfit.interfaces.formats import read_config, validate, write_config_files
from memfit.interfaces.formats.tables import table

MODEL = "meta-llama/Llama-2-7b-hf"
FLAGS = (f"--stage sft --do_train --model_name_or_path {MODEL} --dataset alpaca_en_demo --template default "
         "--finetuning_type lora --cutoff_len 4096 --quantization_bit 4 --per_device_train_batch_size 2 --bf16")
# what those flags say, as LLaMA-Factory reads them
READ = {"tuning": "qlora", "quant_bits": 4, "seq_len": 4096, "micro_batch": 2, "precision": "bf16-mixed",
        "method": "sft"}
DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 3}}
ACCELERATE = "distributed_type: MULTI_GPU\nnum_processes: 4\nmixed_precision: bf16\n"


def _scenario(tmp_path, text: str, **typed):
    (tmp_path / "ds.json").write_text(json.dumps(DS))
    (tmp_path / "acc.yaml").write_text(ACCELERATE)
    script = tmp_path / "run.sh"
    script.write_text(text + "\n")
    a = argparse.Namespace(**{**blank_arguments(), "gpu": "a100-80gb", "from_file": [str(script)], **typed})
    return scenario_and_file(a)


def _parts(imported) -> list:
    return [p for p in imported.companions.values() if p.format == "llamafactory"]


LAUNCHES = {  # launch form -> (command, GPUs the launcher gives)
    "python src/train.py": (f"python src/train.py {FLAGS}", 1),
    "python src/train_bash.py": (f"CUDA_VISIBLE_DEVICES=0 python ../../src/train_bash.py {FLAGS}", 1),
    "torchrun src/train.py": (f"torchrun --nproc_per_node 4 src/train.py {FLAGS}", 4),
    "deepspeed src/train_bash.py": (f"deepspeed --num_gpus 2 src/train_bash.py --deepspeed ds.json {FLAGS}", 2),
    "accelerate launch src/train.py": (f"accelerate launch --config_file acc.yaml src/train.py {FLAGS}", 4),
    "torchrun llamafactory launcher": (f"torchrun --nproc_per_node 2 src/llamafactory/launcher.py {FLAGS}", 2),
    "python -m llamafactory.launcher": (f"python -m llamafactory.launcher {FLAGS}", 1),
    "llamafactory-cli train flags": (f"NPROC_PER_NODE=2 llamafactory-cli train {FLAGS}", 2),
    "a copy of the script": (f"python my_sft.py {FLAGS}", 1),
}


@pytest.mark.parametrize("form", LAUNCHES)
def test_each_launch_form_is_read_as_llamafactory(tmp_path, form):
    command, gpus = LAUNCHES[form]
    s, imported, _ = _scenario(tmp_path, command)
    assert s.profile == "llamafactory" and s.model.id == MODEL and s.hardware.world_size == gpus
    assert {k: getattr(s, k) for k in READ} == READ
    assert len(_parts(imported)) == 1 and not any(p.format == "hf" for p in imported.companions.values())
    if "deepspeed" in command:  # --deepspeed names the engine's JSON, read with it
        assert s.engine == "deepspeed" and s.zero_stage == 3


def test_the_flags_are_the_keys_of_its_yaml(tmp_path):
    """The same keys as a YAML, read by the YAML reader: the same run."""
    doc = {"stage": "sft", "do_train": True, "model_name_or_path": MODEL, "dataset": "alpaca_en_demo",
           "template": "default", "finetuning_type": "lora", "cutoff_len": 4096, "quantization_bit": 4,
           "per_device_train_batch_size": 2, "bf16": True}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(doc))
    by_yaml = read_config(tmp_path / "train.yaml")
    assert _parts(_scenario(tmp_path, f"python src/train.py {FLAGS}")[1])[0].knobs == by_yaml.knobs
    assert _parts(_scenario(tmp_path, "python src/train.py train.yaml cutoff_len=1024")[1])[0].knobs == \
        {**by_yaml.knobs, "seq_len": 1024}  # a YAML and key=value overrides, as its read_args merges them


def test_the_issue_command_is_no_longer_a_full_fine_tune_at_2048(tmp_path):
    command = (f"python src/train.py --stage sft --model_name_or_path {MODEL} --finetuning_type lora --cutoff_len "
               "4096 --quantization_bit 4 --per_device_train_batch_size 2 --bf16")
    s = _scenario(tmp_path, command, gpus_per_node=1)[0]
    assert (s.tuning, s.quant_bits, s.seq_len) == ("qlora", 4, 4096)


@pytest.mark.parametrize("command, reader", [
    (f"python ../src/train_bash.py --model_name_or_path {MODEL} --cutoff_len 512", "llamafactory"),  # by its name
    (f"torchrun src/llamafactory/launcher.py --model_name_or_path {MODEL}", "llamafactory"),
    (f"python src/train.py --stage sft --model_name_or_path {MODEL}", "llamafactory"),  # train.py and its own flag
    ("python train.py --stage sft --finetuning_type lora --model_name_or_path gpt2", "llamafactory"),
    ("python train.py --model_name_or_path gpt2 --output_dir o --learning_rate 1e-5", "hf"),
    ("python finetune.py --stage sft --model_name_or_path gpt2 --output_dir o", "hf"),  # one of its flags alone
    ("python src/train.py --model_name_or_path gpt2 --per_device_train_batch_size 2 --output_dir o", "hf"),
])
def test_an_ambiguous_script_is_llamafactorys_when_its_flags_say(tmp_path, command, reader):
    (tmp_path / "run.sh").write_text(command + "\n")
    assert {p.format for p in read_config(tmp_path / "run.sh").companions.values()} == {reader}


def test_switches_parse_as_llamafactorys_hfargumentparser(tmp_path):
    imported = _scenario(tmp_path, f"python src/train.py {FLAGS} --no_use_fast_tokenizer --pure_bf16 yes")[1]
    doc = _parts(imported)[0].doc
    assert doc["use_fast_tokenizer"] is False and doc["pure_bf16"] is True and doc["bf16"] is True
    with pytest.raises(MemfitError, match="takes one value"):  # its parser leaves `v_proj` unused and refuses
        _scenario(tmp_path, f"python src/train.py {FLAGS} --lora_target q_proj v_proj")


@pytest.fixture(scope="module")
def llamafactory_venv():
    if not (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():
        pytest.skip(f"no LLaMA-Factory venv at {validate.LLAMAFACTORY_VENV} (tests/formats/README.md)")


def test_llamafactorys_own_parser_reads_the_flags_as_memfit_does(tmp_path, llamafactory_venv):
    """get_train_args on the launch's words (about 30 s: it imports transformers, peft and trl)."""
    (tmp_path / "ds.json").write_text(json.dumps(DS))
    words = shlex.split(f"{FLAGS} --gradient_accumulation_steps 4 --deepspeed ds.json --lora_rank 16")
    s, imported, _ = _scenario(tmp_path, "deepspeed --num_gpus 2 src/train.py " + " ".join(words))
    parsed = validate.validate_llamafactory_flags(words, base_dir=tmp_path)
    assert (parsed["finetuning_type"], parsed["quantization_bit"]) == ("lora", s.quant_bits) and s.tuning == "qlora"
    assert parsed["cutoff_len"] == s.seq_len and parsed["per_device_train_batch_size"] == s.micro_batch
    assert parsed["gradient_accumulation_steps"] == s.grad_accum and parsed["lora_rank"] == s.lora_rank
    assert parsed["bf16"] and s.precision == "bf16-mixed" and parsed["deepspeed"].endswith("ds.json")


# --- keys and values of older releases ----------------------------------------------------------------------

BASE = {"model_name_or_path": MODEL, "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "per_device_train_batch_size": 2, "cutoff_len": 1024, "bf16": True}
OLDER = [  # (another release's key (first) and what goes with it, the knobs they say, what the warning says)
    ({"evaluation_strategy": "steps"}, {}, "transformers 4.37.2 .. 4.45.2 (LLaMA-Factory 0.0.9 .. 0.9.3 admit it), "
                                           "not of LLaMA-Factory 0.9.5: read as eval_strategy"),
    ({"quantization_method": "bitsandbytes", "quantization_bit": 4}, {"tuning": "qlora"}, "LLaMA-Factory 0.8.3"),
    ({"flash_attn": True}, {"attention": "flash"}, "LLaMA-Factory 0.1.8"),
    ({"flash_attn": False}, {"attention": "eager"}, "LLaMA-Factory 0.1.8"),
    ({"flash_attn": "off"}, {"attention": "eager"}, "LLaMA-Factory 0.7.0"),
    ({"dpo_beta": 0.2, "stage": "dpo"}, {"method": "dpo"}, "LLaMA-Factory 0.1.6"),
    ({"stage": "orpo"}, {"method": "dpo"}, "LLaMA-Factory 0.6.2"),
    ({"sft_packing": True}, {"padding": "packed"}, "LLaMA-Factory 0.2.0"),
    ({"max_source_length": 1024, "max_target_length": 512}, {"seq_len": 1536}, "LLaMA-Factory 0.0.9"),
    ({"num_layer_trainable": 4, "finetuning_type": "freeze"}, {"freeze_trainable_layers": 4}, "LLaMA-Factory 0.0.9"),
    ({"per_gpu_train_batch_size": 8}, {"micro_batch": 8}, "transformers 4.37.2"),
    ({"adafactor": True}, {"optimizer": "adafactor"}, "transformers 4.37.2"),
    ({"checkpoint_dir": "saves/sft", "resume_lora_training": False}, {},
     "LLaMA-Factory 0.0.9 .. 0.3.3, not of LLaMA-Factory 0.9.5: read as adapter_name_or_path"),
]


def _yaml(tmp_path, extra: dict) -> Path:
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({k: v for k, v in {**BASE, **extra}.items()
                                                     if not (k == "cutoff_len" and "max_source_length" in extra)}))
    return tmp_path / "train.yaml"


@pytest.mark.parametrize("extra, knobs, release", OLDER, ids=[next(iter(e)) for e, _, _ in OLDER])
def test_an_older_releases_key_or_value_is_read_with_a_warning_naming_the_release(tmp_path, extra, knobs, release):
    imported = read_config(_yaml(tmp_path, extra))
    assert {k: imported.knobs[k] for k in knobs} == knobs
    key = next(iter(extra))
    warned = [w for w in imported.warnings if f": {key}:" in w]
    assert len(warned) == 1 and release in warned[0], imported.warnings
    assert not imported.unread


def test_a_key_and_its_older_name_that_disagree_is_one_line(tmp_path):
    with pytest.raises(MemfitError, match="sft_packing: True but packing says False"):
        read_config(_yaml(tmp_path, {"sft_packing": True, "packing": False}))


def test_a_key_no_release_had_is_still_refused(tmp_path):
    with pytest.raises(MemfitError, match="unknown key"):
        read_config(_yaml(tmp_path, {"evaluation_stratgy": "steps"}))


def test_an_older_memory_key_memfit_does_not_model_caps_the_verdict(tmp_path):
    """visual_inputs (0.7.0 .. 0.8.3): a vision tower memfit leaves out; the estimate is at most tight."""
    path = _yaml(tmp_path, {"visual_inputs": True})
    s = scenario_and_file(argparse.Namespace(**{**blank_arguments(), "gpu": "a100-80gb", "from_file": [str(path)]}))[0]
    assert any("visual_inputs" in u and "LLaMA-Factory 0.7.0" in u for u in s.unread)
    from memfit.roles.estimate import estimate

    e = estimate(s)
    assert e.verdict == "tight" and any(a.startswith("not read:") and "visual_inputs" in a for a in e.assumptions)


def test_train_bash_era_defaults_that_hold_more_memory_are_read(tmp_path):
    """src/train_bash.py is 0.0.9 .. 0.7.0's: 0.6.x ran eager attention and 0.4.0 a LoRA dropout of 0.1 unless told
    otherwise, so the larger is estimated (and said); src/train.py (0.7.1 on) keeps the pinned defaults."""
    old = _scenario(tmp_path, f"python src/train_bash.py {FLAGS}")
    assert (old[0].attention, old[0].lora_dropout) == ("eager", 0.1)
    assert any("flash_attn='disabled': unstated" in n for n in old[2])
    said = _scenario(tmp_path, f"python src/train_bash.py {FLAGS} --flash_attn True --lora_dropout 0.05")[0]
    assert (said.attention, said.lora_dropout) == ("flash", 0.05)
    new = _scenario(tmp_path, f"python src/train.py {FLAGS}")[0]
    assert (new.attention, new.lora_dropout) == ("sdpa", 0.0)


def test_a_rewrite_keeps_the_files_spelling_and_refuses_what_its_release_cannot_say(tmp_path):
    imported = read_config(_yaml(tmp_path, {"sft_packing": False, "flash_attn": True}))
    text = write_config_files(imported, {"padding": "packed"})[0].new_text
    assert "sft_packing: true" in text and "\npacking" not in text
    with pytest.raises(MemfitError, match="flash_attn: True is how LLaMA-Factory 0.1.8 .. 0.6.3 said flash_attn"):
        write_config_files(imported, {"attention": "sdpa"})
    launch = _parts(_scenario(tmp_path, f"python src/train_bash.py {FLAGS}")[1])[0]
    with pytest.raises(MemfitError, match="does not run on every release of src/train_bash.py"):
        write_config_files(launch, {"attention": "flash"})


def test_the_release_table_names_real_releases_and_pinned_keys():
    """Every row is another release's (a key of tables/llamafactory.json is none), each renamed key stands for a
    pinned key, and each row names the releases that took it (from tools/llamafactory_release_keys.py)."""
    import re

    f, pinned = table("llamafactory_other_releases"), table("llamafactory")
    now = {k: spec for cls, keys in pinned.items() if cls != "source" for k, spec in keys.items()}
    older = {**f["keys"], **f["transformers_keys"]}
    assert older and not set(older) & set(now)
    assert all(re.fullmatch(r"(LLaMA-Factory|transformers) \d+\.\d+\.\d+( \.\. \d+\.\d+\.\d+)?( \(.*\))?", span)
               for span in older.values())
    for old, row in f["renamed"].items():
        assert old in older and row["now"] in now, old
    for key in [*f["memory"], *(k for row in f["summed"].values() for k in row["keys"])]:
        assert key in older, key
    for key, rows in f["values"].items():
        assert all(row["now"] in now[key].get("choices", [row["now"]]) for row in rows.values()), key
    assert set(f["entry_points"]) >= {"src/train_bash.py", "src/train.py"}
