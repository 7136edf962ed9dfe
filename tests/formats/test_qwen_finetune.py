"""Qwen-1's own finetune.py (formats/launch_qwen.py, tables/qwen_finetune.json): its flags beyond TrainingArguments
are read as LoRA / Q-LoRA / full fine-tuning at the script's padded length, detection is explicit, and a flag the
table does not know is still named."""
import json
import shutil
from pathlib import Path

import pytest

from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import launch_qwen, read_config

HERE = Path(__file__).resolve().parent
QWEN = HERE / "corpus" / "qwen" / "finetune"
TRAINING = ("--bf16 True --output_dir out --per_device_train_batch_size 2 --gradient_accumulation_steps 8 "
            "--gradient_checkpointing")


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """No hub: the catalog holds every model used here."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def _launch(tmp_path: Path, flags: str, script: str = "finetune.py", ds: str | None = "ds_config_zero2.json",
            gpus: int = 2) -> Path:
    """A torchrun launch of `script` with `flags`, beside Qwen's ZeRO-2 JSON (or a ZeRO-3 copy of it)."""
    if ds:
        doc = json.loads((QWEN / "ds_config_zero2.json").read_text())
        if ds == "zero3":
            doc["zero_optimization"] = {"stage": 3}
        (tmp_path / "ds.json").write_text(json.dumps(doc))
        flags += " --deepspeed ds.json"
    path = tmp_path / "run.sh"
    path.write_text(f"torchrun --nproc_per_node {gpus} {script} --model_name_or_path Qwen/Qwen-7B {flags}\n")
    return path


def _estimate(path: Path, monkeypatch, capsys, *hw: str) -> tuple[int, dict | str]:
    monkeypatch.chdir(path.parent)
    code = main(["estimate", "--from", str(path), "--gpu", *(hw or ("a100-80gb",)), "--json"])
    got = capsys.readouterr()
    return code, json.loads(got.out) if code == 0 else got.err


def _peak(doc: dict) -> float:
    return doc["per_rank"]["device_total"]["peak_bytes"] / 2**30


def _notes(run) -> str:
    return " | ".join(run.assumed + run.warnings)


# --- the corpus scripts ---------------------------------------------------------------------------------------

def test_finetune_ds_is_a_full_fine_tune_at_its_padded_length_under_its_zero2_json():
    run = read_config(QWEN / "finetune_ds.sh")
    k = run.knobs
    assert (k["tuning"], k["seq_len"], k["padding"]) == ("full", 512, "padded")
    assert (k["engine"], k["zero_stage"], k["micro_batch"], k["grad_accum"]) == ("deepspeed", 2, 1, 16)
    assert "--model_max_length" not in " ".join(run.warnings)  # read, no longer named as a flag memfit leaves out


@pytest.mark.parametrize("name", ["finetune_lora_ds.sh", "finetune_lora_single_gpu.sh"])
def test_lora_scripts_on_a_base_model_train_adapters_and_copies_of_wte_and_lm_head(name):
    k = read_config(QWEN / name).knobs
    assert (k["tuning"], k["lora_rank"], k["lora_alpha"], k["seq_len"], k["padding"]) == ("lora", 64, 16, 512, "padded")
    assert k["lora_dropout"] == pytest.approx(0.05)
    assert set(k["lora_targets"]) == {"c_attn", "attn.c_proj", "mlp.c_proj", "w1", "w2"}  # c_proj: both of Qwen-1's
    assert tuple(k["modules_to_save"]) == ("embed_tokens", "lm_head")
    assert (k.get("engine"), k.get("zero_stage")) == (("deepspeed", 2) if name.endswith("_ds.sh") else (None, None))


def test_single_gpu_lora_uses_the_scripts_own_optimizer_default():
    """finetune.py's TrainingArguments says optim adamw_torch (transformers 5: adamw_torch_fused); with ZeRO-2 the
    DeepSpeed JSON's optimizer section decides instead."""
    assert read_config(QWEN / "finetune_lora_single_gpu.sh").knobs["optimizer"] == "adamw-foreach"
    assert read_config(QWEN / "finetune_lora_ds.sh").knobs.get("optimizer") != "adamw-foreach"


def test_qlora_script_is_lora_over_the_gptq_int4_checkpoint_without_upcast_or_copies():
    run = read_config(QWEN / "finetune_qlora_ds.sh")
    k = run.knobs
    assert run.model_name == "Qwen/Qwen-7B-Chat-Int4"
    assert (k["tuning"], k["kbit_upcast"], k["precision"], k["seq_len"]) == ("qlora", False, "fp16-mixed", 512)
    assert "modules_to_save" not in k  # q_lora (and a chat model): no copies


def test_each_script_estimates_below_the_full_fine_tune_it_was_read_as_before(tmp_path, monkeypatch, capsys):
    """LoRA < full at the same length and hardware; the script's 512 tokens < finetune.py's default 8192."""
    full = _estimate(_launch(tmp_path, TRAINING + " --model_max_length 512"), monkeypatch, capsys)[1]
    lora = _estimate(_launch(tmp_path, TRAINING + " --model_max_length 512 --use_lora"), monkeypatch, capsys)[1]
    long = _estimate(_launch(tmp_path, TRAINING + " --use_lora"), monkeypatch, capsys)[1]
    assert _peak(lora) < _peak(full) and _peak(lora) < _peak(long)
    assert "lora" in json.dumps(lora).lower()


def test_the_int4_qlora_estimate_is_far_below_bf16_lora(tmp_path, monkeypatch, capsys):
    code, qlora = _estimate(QWEN / "finetune_qlora_ds.sh", monkeypatch, capsys, "rtx4090")
    assert code == 0, qlora
    code, lora = _estimate(QWEN / "finetune_lora_ds.sh", monkeypatch, capsys, "rtx4090", "--gpus", "2")
    assert code == 0, lora
    assert _peak(qlora) < 0.6 * _peak(lora)


# --- detection ------------------------------------------------------------------------------------------------

def test_detection_needs_the_script_name_and_one_of_its_own_flags():
    assert launch_qwen.matches("finetune.py", {"use_lora": True})
    assert launch_qwen.matches("/x/Qwen/finetune.py", {"model_max_length": 512})
    assert not launch_qwen.matches("finetune.py", {"bf16": True, "lora_r": 8})  # lora_r alone: TRL's too
    assert not launch_qwen.matches("train.py", {"use_lora": True, "q_lora": True})


def test_another_scripts_lora_flags_stay_named_not_read(tmp_path):
    run = read_config(_launch(tmp_path, TRAINING + " --use_lora --model_max_length 512", script="train.py"))
    assert run.knobs.get("tuning", "full") == "full" and "seq_len" not in run.knobs
    assert "--use_lora" in _notes(run) and "--model_max_length" in _notes(run)


def test_a_flag_the_table_does_not_know_is_still_named(tmp_path):
    run = read_config(_launch(tmp_path, TRAINING + " --use_lora --lora_r 8 --my_extra_flag 3"))
    assert run.knobs["lora_rank"] == 8 and "--my_extra_flag" in " ".join(run.warnings)
    assert "--lora_r" not in " ".join(run.warnings) and "--use_lora" not in " ".join(run.warnings)


def test_script_defaults_apply_when_flags_are_absent(tmp_path):
    k = read_config(_launch(tmp_path, TRAINING + " --use_lora --lora_target_modules c_attn w2", ds=None)).knobs
    assert k["seq_len"] == launch_qwen.facts()["arguments"]["model_max_length"]["default"] == 8192
    assert k["lora_targets"] == ("c_attn", "w2")


# --- what train() does with the arguments ---------------------------------------------------------------------

def test_a_chat_model_trains_no_wte_or_lm_head_copies(tmp_path):
    path = _launch(tmp_path, TRAINING + " --use_lora")
    path.write_text(path.read_text().replace("Qwen/Qwen-7B", "Qwen/Qwen-7B-Chat"))
    assert "modules_to_save" not in read_config(path).knobs


def test_zero3_lora_on_a_base_model_is_refused_as_finetune_py_does(tmp_path, monkeypatch, capsys):
    code, err = _estimate(_launch(tmp_path, TRAINING + " --use_lora", ds="zero3"), monkeypatch, capsys)
    assert code == 2 and err.startswith("memfit: error:") and "\n" not in err.strip() and "ZeRO3" in err


def test_qlora_under_zero3_is_a_warning_and_q_lora_alone_a_full_fine_tune(tmp_path):
    run = read_config(_launch(tmp_path, TRAINING + " --use_lora --q_lora", ds="zero3"))
    assert run.knobs["tuning"] == "qlora" and "incompatible with QLoRA" in " ".join(run.warnings)
    run = read_config(_launch(tmp_path, TRAINING + " --q_lora"))
    assert run.knobs["tuning"] == "full" and "--q_lora without --use_lora" in " ".join(run.warnings)


def test_lora_bias_is_named_as_not_modelled_and_bad_values_are_one_line(tmp_path, monkeypatch, capsys):
    run = read_config(_launch(tmp_path, TRAINING + " --use_lora --lora_bias all"))
    assert "--lora_bias all: not modelled" in " ".join(run.warnings)
    code, err = _estimate(_launch(tmp_path, TRAINING + " --model_max_length long"), monkeypatch, capsys)
    assert code == 2 and "--model_max_length" in err and "\n" not in err.strip()
    code, err = _estimate(_launch(tmp_path, TRAINING + " --use_lora --lora_bias some"), monkeypatch, capsys)
    assert code == 2 and "--lora_bias" in err


def test_peft_keeps_a_gptq_models_weights_in_their_dtype_as_the_table_says():
    """The table's q_lora fact, from running the installed PEFT: prepare_model_for_kbit_training casts 16-bit
    parameters to fp32 unless the model is GPTQ-quantized."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    facts = launch_qwen.facts()
    assert facts["versions"]["peft"] == peft.__version__  # a new release: run this test's check again, then bump
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=64)
    dtypes = {}
    for method in ("gptq", None):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        model.quantization_method = method
        peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        dtypes[method] = {p.dtype for p in model.parameters()}
    assert dtypes[None] == {torch.float32}  # the upcast happens for other models: the check can tell
    assert (dtypes["gptq"] == {torch.float32}) == facts["q_lora_kbit_upcast"]


def test_the_table_records_the_source_it_was_read_from():
    facts = launch_qwen.facts()
    assert facts["repo"] == "QwenLM/Qwen" and facts["path"] == "finetune.py" and len(facts["commit"]) == 40
    assert set(facts["detect"]) <= set(facts["arguments"])
    for spec in facts["arguments"].values():
        assert {"class", "type", "default"} <= set(spec)


def test_the_corpus_copy_of_ds_config_is_used(tmp_path):
    """The launch names finetune/ds_config_zero2.json from the repository root (its `cd`)."""
    shutil.copytree(QWEN, tmp_path / "finetune")
    run = read_config(tmp_path / "finetune" / "finetune_lora_ds.sh")
    assert any(p.name == "ds_config_zero2.json" for p in run.companions.values()) or \
        any(c.name == "ds_config_zero2.json" for p in run.companions.values() for c in p.companions.values())
