"""LLaMA-Factory v1 YAML (issue 12 item 1): detected, read onto memfit's knobs, checked against v1's own argument
dataclasses and parser in the LLaMA-Factory virtual environment (tests/formats/README.md; those tests skip
without it)."""
import json
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import detect_format, read_config, write_config_files
from memfit.interfaces.formats import validate
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


@pytest.mark.parametrize("name", EXAMPLES)
def test_v1s_own_parser_accepts_each_example_and_agrees_with_memfit(name, venv, monkeypatch):
    monkeypatch.chdir(HERE)  # config_file paths resolve from the working directory, as in a run
    doc = yaml.safe_load((HERE / name).read_text())
    parsed = venv.validate_llamafactory_v1(doc)
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


def test_v1s_parser_and_memfit_both_refuse_an_unknown_key(venv):
    from memfit.interfaces.formats.framework_tables import ValidationFailed
    doc = {"model": "Qwen/Qwen3-0.6B", "micro_batch_size": 1, "cutof_len": 1024}
    with pytest.raises(ValidationFailed, match="cutof_len"):
        venv.validate_llamafactory_v1(doc)
    with pytest.raises(MemfitError, match="did you mean 'cutoff_len'") as e:
        _read(yaml.safe_dump(doc))
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
                        ("micro_batch_size: lots\n", "micro_batch_size")):
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


def test_v1_files_are_not_rewritten():
    imported = read_config(HERE / "lora_sft_fsdp2.yaml", gpus=8)
    files = write_config_files(imported, dict(imported.knobs))
    assert files[0].new_text == files[0].old_text
    with pytest.raises(MemfitError, match="does not write it yet"):
        write_config_files(imported, {**imported.knobs, "micro_batch": 2})


def _estimate(capsys, path) -> dict:
    code = main(["estimate", "--from-file", str(path), "--gpu", "a100", "--gpus-per-node", "8", "--json"])
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
