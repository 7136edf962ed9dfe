"""Issue 12: a setting that changes memory is read or named as not modelled (GaLore / BAdam / APOLLO optimizers,
trained vision towers, NEFTune, torch.compile, ...), never dropped silently."""
import json

import pytest

from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config
from memfit.interfaces.formats.tables import table

LF_YAML = """\
model_name_or_path: meta-llama/Llama-3.1-8B-Instruct
stage: sft
finetuning_type: full
cutoff_len: 1024
per_device_train_batch_size: 2
bf16: true
"""
TRL_YAML = "model_name_or_path: Qwen/Qwen2-7B\nmax_length: 2048\nper_device_train_batch_size: 2\n"
BASES = {"llamafactory": (LF_YAML, "train.yaml"), "hf": (TRL_YAML, "sft_config.yaml")}
KEY_TABLES = {"llamafactory": ("ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments"),
              "hf": ("TrainingArguments", "SFTConfig", "ModelConfig")}


def _entries():
    return [(fmt, key) for fmt in BASES for key in table("not_modelled")[fmt]]


def _keys(fmt: str) -> dict:
    return {k: v for cls in KEY_TABLES[fmt] for k, v in table(fmt).get(cls, {}).items()}


def _on_value(fmt: str, key: str):
    entry, spec = table("not_modelled")[fmt][key], _keys(fmt)[key]
    if "when" in entry:
        return entry["when"]
    return {"bool": True, "int": 5, "float": 5.0}.get(spec.get("type"), (spec.get("choices") or ["convert"])[0])


def _read(tmp_path, fmt: str, extra: str):
    text, name = BASES[fmt]
    path = tmp_path / name
    path.write_text(text + extra)
    return read_config(path, gpus=8)


@pytest.mark.parametrize("fmt, key", _entries())
def test_each_entry_is_a_real_key_whose_default_is_off(fmt, key):
    """The catalog names keys the framework's own parser has (key tables derived from its code), and a file at
    the framework's default says nothing."""
    spec = _keys(fmt)[key]
    assert spec.get("default") != _on_value(fmt, key)


@pytest.mark.parametrize("fmt, key", _entries())
def test_a_setting_that_is_on_is_named_with_the_direction_of_the_error(tmp_path, fmt, key):
    value = _on_value(fmt, key)
    imported = _read(tmp_path, fmt, f"{key}: {json.dumps(value)}\n")
    named = [w for w in imported.warnings if f"{key}=" in w and "not modelled" in w]
    assert len(named) == 1 and "memfit estimates" in named[0] and ("too high" in named[0] or "too low" in named[0].lower())


@pytest.mark.parametrize("fmt, key", _entries())
def test_a_setting_at_its_default_says_nothing(tmp_path, fmt, key):
    default = _keys(fmt)[key].get("default")
    imported = _read(tmp_path, fmt, f"{key}: {json.dumps(default)}\n")
    assert not [w for w in imported.warnings if "not modelled" in w]


def test_the_estimate_lists_galore_under_assumptions(tmp_path, capsys):
    path = tmp_path / "galore.yaml"
    path.write_text(LF_YAML + "use_galore: true\ngalore_rank: 128\n")
    assert main(["estimate", "--from", str(path), "--gpu", "a100-80gb", "--gpus", "8", "--json"]) == 0
    listed = [a for a in json.loads(capsys.readouterr().out)["assumptions"] if "use_galore" in a]
    assert len(listed) == 1 and "not modelled" in listed[0]
