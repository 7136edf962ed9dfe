"""bench/cuda_truth.py on the CPU with tiny models: the GPU run's code path (build, HF Trainer's step, the rows, the
budget, --compare) executes here first, and every CUDA reading stays null."""
import json
import math
import subprocess
import sys
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the measuring half runs real steps

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "cuda_truth.py"
# LoRA with checkpointing off, on and reentrant, full fine-tuning (a row flagged for the allocation trace), QLoRA,
# flash on SDPA's flash backend, and Liger (a Triton kernel: unavailable on the CPU)
ROWS = ["l3-lora-mb2-s2048", "l3-lora-mb2-s2048-ckpt", "l3-lora-mb4-s4096-ckpt-reentrant", "l1-full-mb4-s1024",
        "l1-qlora-mb4-s1024", "l1-lora-mb2-s2048-flash-packed", "l1-lora-mb2-s2048-liger"]
CUDA_ONLY = ("max_memory_allocated", "max_memory_reserved", "device_used", "nvml_used", "peak_phase", "history")
HAS_BNB = find_spec("bitsandbytes") is not None


def _script(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda_truth") / "rows.jsonl"
    done = _script("--device", "cpu", "--tiny", "--out", str(out), "--only", ",".join(ROWS))
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _rows(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_each_row_is_real_steps_with_cuda_readings_null(results):
    rows = _rows(results)
    assert list(rows) == ROWS
    for row in rows.values():
        assert row["schema"] == "memfit.cuda_truth/1" and row["device"] == "cpu" and row["tiny"]
        assert row["run"]["versions"]["torch"] == version("torch")
        assert row["run"]["versions"]["transformers"] == version("transformers")
        assert row["run"]["context_bytes"] is None and row["run"]["cublas_workspace_bytes"] is None
    expected_ok = [r for r in ROWS if "liger" not in r and ("qlora" not in r or HAS_BNB)]
    for row_id in expected_ok:
        row = rows[row_id]
        assert row["outcome"] == "ok", (row_id, row["reason"])
        assert all(row[key] is None for key in CUDA_ONLY), row_id
        assert all(v is None for phase in row["phases"].values() for v in phase.values())
        assert set(row["phases"]) == {"forward", "backward", "optimizer_step"}
        assert row["trainable_tensors_with_grad"] == row["trainable_tensors"] > 0, row_id  # every adapter trained
        assert row["median_step_s"] > 0 and len(row["step_seconds"]) == row["steps"] - row["warmup_steps"]
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_step"] / row["median_step_s"])
        model = row["model"]
        pads = 0 if "packed" in row_id else 1  # memfit's padded batch: one padding position in the last row
        assert row["tokens_per_step"] == model["micro_batch"] * model["seq_len"] - pads
        # random weights: the loss of the first steps is the uniform guess over the tiny vocabulary
        assert all(math.isfinite(x) and abs(x - math.log(model["vocab"])) < 0.5 for x in row["losses"])


def test_each_configuration_is_built_as_its_arguments_say(results):
    rows = _rows(results)
    assert rows["l3-lora-mb2-s2048"]["checkpointed_layers"] == 0
    for row_id in ("l3-lora-mb2-s2048-ckpt", "l3-lora-mb4-s4096-ckpt-reentrant"):
        assert rows[row_id]["checkpointed_layers"] == rows[row_id]["model"]["layers"]
    lora, full = rows["l3-lora-mb2-s2048"], rows["l1-full-mb4-s1024"]
    assert 0 < lora["params_trainable"] < lora["params_total"]
    assert full["params_trainable"] == full["params_total"]
    assert "flash backend only" in rows["l1-lora-mb2-s2048-flash-packed"]["attention_kernel"]
    assert rows["l1-lora-mb2-s2048-liger"]["outcome"] == "unavailable"
    assert "CUDA" in rows["l1-lora-mb2-s2048-liger"]["reason"]


def test_qlora_runs_bitsandbytes_nf4_or_says_it_stopped_at_the_quantization_call(results):
    row = _rows(results)["l1-qlora-mb4-s1024"]
    if HAS_BNB:  # bitsandbytes' CPU backend: the real 4-bit path of transformers' quantizer
        assert row["outcome"] == "ok"
        assert row["quantized_linears"] == 7 * row["model"]["layers"]  # q k v o gate up down; lm_head kept
    else:
        assert row["outcome"] == "unavailable"
        assert "bitsandbytes is not installed" in row["reason"] and "quantization call" in row["reason"]


def test_a_spent_budget_starts_no_more_rows_and_a_rerun_resumes(results, tmp_path, capsys):
    import cuda_truth  # in this process: the subprocess above already ran the script as a script

    out = tmp_path / "rows.jsonl"
    lines = results.read_text().splitlines()
    kept = lines[:2]
    out.write_text("\n".join(kept) + "\n" + lines[2][:40])  # a run killed while it wrote its third row
    code = cuda_truth.main(["--device", "cpu", "--tiny", "--out", str(out), "--resume", "--budget-s", "0.001",
                            "--only", ",".join([*ROWS[:2], "l1-lora-mb1-s512-ckpt", "l1-lora-mb1-s1024-ckpt"])])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # the two kept rows stay as they were, the half row is gone, one new row ran before the budget was checked again,
    # the last never started
    assert [r["id"] for r in rows] == [*ROWS[:2], "l1-lora-mb1-s512-ckpt"]
    assert out.read_text().splitlines()[:2] == kept
    assert rows[-1]["outcome"] == "ok"
    assert "budget of 0.001 s spent: 1 rows written" in capsys.readouterr().out


def test_compare_prints_memfits_estimate_beside_each_row(results):
    done = _script("--compare", str(results))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("device total within 5%: 0 of 0")  # no CUDA row: nothing measured to judge
    assert lines[1].startswith("speed: predicted vs measured tokens/s over")
    assert all(any(line.startswith(row_id) for line in lines) for row_id in ROWS)
    assert "ran on the CPU with tiny models" in done.stdout and lines[-1].startswith("next:")
    data = json.loads(_script("--compare", str(results), "--json").stdout)
    assert [c["id"] for c in data["rows"]] == ROWS
    for c in data["rows"]:
        measured, estimated = c["allocated"]
        assert measured is None and estimated > 0
        assert c["peak_phase"][1] in ("forward", "backward", "optimizer_step")
    timed = [c for c in data["rows"] if c["outcome"] == "ok"]
    assert data["summary"]["speed_rows"] == sum(all(c["tokens_per_s"]) for c in timed) >= 3


def test_compare_of_a_missing_file_says_so_in_one_line(tmp_path):
    done = _script("--compare", str(tmp_path / "none.jsonl"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "no such results file" in done.stderr


def test_the_peak_replay_finds_the_live_set_at_the_largest_total():
    from cuda_truth_run import peak_allocations

    frame = {"filename": "/x/transformers/models/llama/modeling_llama.py", "line": 7, "name": "forward"}
    torch_frame = {"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"}
    before = {"segments": [{"device": 0, "blocks": [
        {"address": 100, "size": 512, "requested_size": 500, "state": "active_allocated"},
        {"address": 2000, "size": 512, "requested_size": 512, "state": "inactive"}]}],
        "device_traces": [[{"action": "snapshot", "addr": 0, "size": 0}]]}
    events = [{"action": "alloc", "addr": 3000, "size": 300, "frames": [torch_frame, frame]},
              {"action": "alloc", "addr": 4000, "size": 200, "frames": [frame]},
              {"action": "free_requested", "addr": 3000, "size": 300},
              {"action": "free_completed", "addr": 3000, "size": 300},
              {"action": "alloc", "addr": 5000, "size": 50, "frames": []}]
    after = {"segments": [], "device_traces": [before["device_traces"][0] + events]}
    out = peak_allocations(before, after, 0, {100: ("parameters (bf16)", "parameter w (bf16)")})
    assert out["live_at_step_start"] == 500 and out["peak_bytes"] == 1000 and out["events"] == 5
    assert [b["bytes"] for b in out["top_blocks"]] == [500, 300, 200]
    assert out["top_blocks"][0]["what"] == "parameter w (bf16)"
    site = "modeling_llama.py:7 forward"
    assert out["top_sites"][0] == {"bytes": 500, "blocks": 1, "site": "parameters (bf16)"}
    assert {"bytes": 500, "blocks": 2, "site": site} in out["top_sites"]


def test_the_device_rows_are_30_distinct_memfit_runs_that_fit_one_h200():
    import cuda_truth

    from memfit.roles.estimate import estimate

    ids = [r["id"] for r in cuda_truth.ROWS]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    for row in cuda_truth.ROWS:
        s = cuda_truth.scenario_of(row["args"], tiny=False)
        assert s.hardware.gpu.id == "h200" and s.hardware.world_size == 1
        assert estimate(s).device_total.peak.total < 0.8 * s.hardware.gpu.memory_bytes, row["id"]
        assert cuda_truth.scenario_of(row["args"], tiny=True).model.num_layers == 2


def test_only_cuda_rows_become_real_runs_for_the_error_bands(results):
    # the bands' real GPU runs (bench/real_runs.py) read bench/cuda_h200.json through this: a CPU row is no GPU run
    sys.path.insert(0, str(ROOT / "bench"))
    import cuda_truth

    assert cuda_truth.real_rows(results) == []
