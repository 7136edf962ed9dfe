"""Bad input: one clear line on stderr, exit code 2, no traceback."""
import json
import subprocess
import sys

import pytest

from memfit.interfaces.cli.main import main

BASE = ["estimate", "qwen2-7b", "--gpu", "rtx4090"]


def run(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def assert_one_line(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]


def test_unknown_model_suggests_close_names(capsys):
    assert_one_line(*run(["estimate", "qwen2-7bb", "--gpu", "rtx4090"], capsys), "unknown model", "qwen2-7b")


def test_unknown_gpu(capsys):
    assert_one_line(*run(["estimate", "qwen2-7b", "--gpu", "rtx4099"], capsys), "unknown gpu", "rtx4090")


def test_missing_config_file(tmp_path, capsys):
    assert_one_line(*run(["estimate", str(tmp_path / "nope.json"), "--gpu", "rtx4090"], capsys), "no such file")


def test_malformed_config_json(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    assert_one_line(*run(["estimate", str(tmp_path), "--gpu", "rtx4090"], capsys), "malformed config.json")


def test_unsupported_architecture(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
    assert_one_line(*run(["estimate", str(tmp_path), "--gpu", "rtx4090"], capsys), "unsupported architecture",
                    "mamba")


def test_local_config_of_a_supported_architecture_works(tmp_path, capsys):
    cfg = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1000, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["estimate", str(tmp_path), "--gpu", "rtx4090", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    h, i, v, layers = 512, 1024, 1000, 4
    assert doc["params"]["total"] == 2 * v * h + layers * (4 * h * h + 3 * h * i + 2 * h) + h


@pytest.mark.parametrize("argv, needle", [
    (BASE + ["--micro-batch", "0"], "--micro-batch must be a positive integer"),
    (BASE + ["--seq", "-5"], "--seq-len/--seq must be a positive integer"),
    (BASE + ["--micro-batch", "2.5"], "expected a whole number"),
    (BASE + ["--seq", "1e12"], "--seq-len/--seq must be within [1, 16,777,216]"),  # issue 14: was answered
    (BASE + ["--gpus", "0"], "--gpus"),
    (BASE + ["--gpu-mem", "-3GB"], "--gpu-mem"),
    (BASE + ["--gpu-mem", "lots"], "is not a size"),
    (BASE + ["--zero", "3", "--offload-optimizer", "cpu", "--ratio", "1.5"], "within [0, 1]"),
    (BASE + ["--zero", "4"], "--zero-stage/--zero must be within [0, 3], got 4"),
    (BASE + ["--gpus", "2", "--zero", "2", "--offload-optimizer", "cpu", "--ratio", "0.5"], "DeepSpeed rejects"),
    (BASE + ["--gpus", "2", "--zero", "2", "--offload-param", "cpu"], "DeepSpeed rejects offload_param"),
    (["estimate", "qwen2-7b", "--gpu", "v100-32gb", "--attn", "flash"], "flash-attention 2 rejects"),
    (["estimate", "qwen2-7b", "--gpu", "t4", "--precision", "bf16-mixed"], "no bf16 support"),
    (BASE + ["--tuning", "lora", "--lora-targets", "nonexistent_proj"], "match no module"),
    (BASE + ["--attn", "magic"], "--attention/--attn 'magic' is not valid"),
    (BASE + ["--profile", "megatron"], "unknown framework profile"),
    (BASE + ["--gpus", "2", "--zero", "3", "--fsdp", "full_shard"], "name different engines"),
    (BASE + ["--gpus", "2", "--engine", "ddp", "--zero", "2"], "name different engines"),
    (["estimate", "qwen2-7b"], "say which gpu"),
])
def test_bad_knobs(argv, needle, capsys):
    assert_one_line(*run(argv, capsys), needle)


def test_console_script_prints_no_traceback():
    out = subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", "estimate", "no-such-model", "--gpu", "a100-80gb"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.startswith("memfit: error: unknown model")


@pytest.mark.parametrize("extra", [["--precision", "bf16-pure"], ["--gpus", "2", "--zero", "2"]])
def test_frozen_fp32_where_nothing_keeps_fp32_weights_is_refused(extra, capsys):
    argv = BASE + ["--tuning", "lora", "--precision", "bf16-mixed", "--frozen-fp32", *extra]
    assert_one_line(*run(argv, capsys), "--frozen-fp32 has no effect here", "mixed precision on a single gpu or ddp")


def test_optimizer_in_backward_where_torchtune_does_not_step_in_backward(capsys):
    """torchtune 0.6.1 reads optimizer_in_bwd only in its full recipes, which refuse it with gradient accumulation."""
    tt = ["estimate", "llama-3.2-1b", "--gpu", "a100-80gb", "--profile", "torchtune", "--optimizer-in-backward"]
    assert_one_line(*run(tt + ["--tuning", "lora"], capsys), "--optimizer-in-backward has no effect here",
                    "--tuning is lora")
    assert_one_line(*run(tt + ["--tuning", "full", "--grad-accum", "4"], capsys),
                    "optimizer_in_bwd steps each parameter inside backward", "--grad-accum 1")
