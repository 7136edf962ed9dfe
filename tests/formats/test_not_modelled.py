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


# --- issue 27: a setting that can raise memory caps the verdict; one that can only lower it does not ---------------

ERRS = {"high": "only lowers memory", "low": "raises device memory", "host": "raises host RAM",
        "either": "not checked, or both ways"}


def _all_entries():
    return [(fmt, key) for fmt, rows in table("not_modelled").items() if isinstance(rows, dict)
            for key in rows if not key.startswith("_")]


@pytest.mark.parametrize("fmt, key", _all_entries())
def test_each_entry_says_which_way_memfit_errs_and_its_text_agrees(fmt, key):
    entry = table("not_modelled")[fmt][key]
    assert entry["errs"] in ERRS
    text = entry["memfit"].lower()
    device_low = "too low" in text.replace("host ram too low", "")
    if device_low:  # memfit's number can be under the real one on the GPU: it must cap
        assert entry["errs"] in ("low", "either"), (fmt, key)
    elif "host ram too low" in text:  # under on host RAM only: it caps where host RAM is judged
        assert entry["errs"] in ("host", "either"), (fmt, key)
    if entry["errs"] == "high":
        assert "high" in text and "not checked" not in text and "too low" not in text, (fmt, key)


def _estimate(tmp_path, capsys, extra: str, *more: str) -> dict:
    path = tmp_path / "train.yaml"
    path.write_text(LF_YAML.replace("finetuning_type: full", "finetuning_type: lora") + extra)  # room to spare
    assert main(["estimate", "--from", str(path), "--gpu", "h200", "--gpus", "8", *more, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("key", [k for k in table("not_modelled")["llamafactory"]])
def test_a_setting_that_can_raise_memory_makes_the_verdict_at_most_tight(tmp_path, capsys, key):
    """On a card with room to spare: "fits" stands for what only lowers memory, "tight" (with the reason under
    assumed) for what can raise it; host RAM only when it is judged."""
    entry = table("not_modelled")["llamafactory"][key]
    value = _on_value("llamafactory", key)
    doc = _estimate(tmp_path, capsys, f"{key}: {json.dumps(value)}\n")
    reasons = [a for a in doc["assumptions"] if a.startswith("not read:") and f"{key}=" in a]
    capped = entry["errs"] in ("low", "either")
    assert doc["verdict"] == ("tight" if capped else "fits") and len(reasons) == capped, doc["verdict"]
    if entry["errs"] == "host":
        judged = _estimate(tmp_path, capsys, f"{key}: {json.dumps(value)}\n", "--host-ram", "2TiB")
        assert judged["verdict"] == "tight"


def test_plan_and_fit_call_no_row_fits_for_a_run_with_an_unread_setting(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text(LF_YAML.replace("finetuning_type: full", "finetuning_type: lora") + "use_unsloth: true\n")
    assert main(["plan", "--from", str(path), "--gpu", "h200", "--gpus", "8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    verdicts = [r["verdict"] for r in plan.get("rows", [])] + [plan["start"]["verdict"]]
    assert "fits" not in verdicts and "tight" in verdicts
    assert main(["fit", str(path), "--gpu", "h200", "--gpus", "8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not read:" in err and "use_unsloth" in err and not (tmp_path / "o").exists()
