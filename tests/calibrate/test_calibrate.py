"""`memfit calibrate` (issue 13 item 5): a monitored run's profile changes the estimate the way the run showed.

Real runs: a tiny Llama that transformers builds from a config.json, trained on the CPU under MemoryMonitor in
its own process; one run holds 256 MiB more host memory than the other. Calibrated from each, the host baseline
differs by the bytes the run held, and the estimate made with the saved profile carries it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.interfaces.cli.main import main

HERE = Path(__file__).resolve().parent
HELD_MIB = 256
STEPS = 6
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
              "vocab_size": 8000, "max_position_embeddings": 512, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
KNOBS = ["--gpu", "a100-80gb", "--precision", "fp32", "--optimizer", "adamw-loop", "--micro-batch", "2",
         "--seq", "64", "--attn", "sdpa"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both runs, each in its own process (its RSS its own)."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("calibrate")
    model = folder / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    paths = {}
    for held in (0, HELD_MIB):
        paths[held] = folder / f"run{held}.jsonl"
        done = subprocess.run([sys.executable, str(HERE / "calibrate_loop.py"), str(model), str(paths[held]),
                               str(STEPS), str(held)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    return model, paths


def _calibrate(capsys, run: Path, model: Path, *extra: str) -> dict:
    assert main(["calibrate", str(run), str(model), *KNOBS, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_host_baseline_moves_by_what_the_run_held(runs, capsys):
    model, paths = runs
    plain = _calibrate(capsys, paths[0], model)["measured"]["process_host_baseline"]
    holding = _calibrate(capsys, paths[HELD_MIB], model)["measured"]["process_host_baseline"]
    assert abs((holding - plain) - HELD_MIB * 2**20) < 0.1 * HELD_MIB * 2**20, (plain, holding)
    assert 0 < plain < 3 * 2**30  # a CPU process with torch and transformers: well under the 3 GiB CUDA default


def test_the_saved_profile_changes_the_host_estimate_by_the_measured_baseline(runs, capsys, tmp_path):
    model, paths = runs
    profile = tmp_path / "machine.toml"
    doc = _calibrate(capsys, paths[HELD_MIB], model, "--save", str(profile))
    assert doc["saved"] == str(profile) and profile.is_file()
    measured = doc["measured"]["process_host_baseline"]

    def host(*extra):
        assert main(["estimate", str(model), *KNOBS, "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["host_per_node"], out["assumptions"]

    (default, _), (calibrated, notes) = host(), host("--machine", str(profile))
    base = {p: v["runtime_overhead"] for p, v in default["phases"].items()} if "phases" in default else None
    assert base is not None, default
    for phase, parts in calibrated["phases"].items():
        assert parts["runtime_overhead"] - base[phase] == measured - 3 * 2**30
    assert any(str(profile) in n and "runtime constants" in n for n in notes)


def test_a_missing_or_broken_profile_is_one_line(tmp_path, capsys):
    broken = tmp_path / "machine.toml"
    broken.write_text("schema = [\n")
    for path in (tmp_path / "absent.toml", broken):
        assert main(["estimate", "qwen2-7b-instruct", "--gpu", "a100-80gb", "--machine", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and str(path) in err


def _cuda_lines(path: Path, ranks: int, reserved: int, peak: int, used: int, rss: int) -> None:
    """What MemoryMonitor writes on a CUDA run (no GPU here: the device-neutral core is what is tested)."""
    for rank in range(ranks):
        name = path if ranks == 1 else path.with_suffix(f".rank{rank}.jsonl")
        lines = [{"schema": "memfit.monitor/1", "rank": rank, "world_size": ranks, "step": step, "time": 1.0 + step,
                  "step_seconds": 0.5, "tokens": 4096, "device_kind": "cuda", "allocated_bytes": peak // 2,
                  "reserved_bytes": reserved, "peak_allocated_bytes": peak, "device_used_bytes": used,
                  "device_total_bytes": 24 * 2**30, "host_rss_bytes": rss} for step in range(1, 5)]
        name.write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.parametrize("gpus, constant", [(1, "cuda_context"), (2, "nccl_one_node")])
def test_a_cuda_run_measures_what_torch_does_not_count(tmp_path, capsys, gpus, constant):
    run = tmp_path / "run.jsonl"
    reserved, context = 18 * 2**30, 700 * 2**20
    _cuda_lines(run, gpus, reserved, 16 * 2**30, reserved + context, 6 * 2**30)
    argv = ["calibrate", str(run), "qwen2-7b-instruct", "--gpu", "rtx4090", "--gpus", str(gpus), "--tuning", "lora",
            "--json"]
    assert main(argv) == 0
    measured = json.loads(capsys.readouterr().out)["measured"]
    expected = context if gpus == 1 else context - 400_000_000  # the default CUDA context is taken out
    assert measured[constant] == expected
    assert 0 < measured["fragmentation_of_churn"] <= 1
