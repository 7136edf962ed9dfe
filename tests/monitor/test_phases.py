"""issue 13 items 2-3: the peak of each phase of a step (mon.phase marks, the HF callback's events) in the
step's line, and `memfit watch` putting each phase's measured peak beside memfit's estimate of that phase."""
import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[monitor])")
import torch.nn as nn  # noqa: E402

from memfit.monitor import MemoryMonitor, probes  # noqa: E402

MiB, GiB = 2**20, 2**30
TEMP = 256 * MiB  # what the optimizer phase allocates, touches and frees each step
LF_LORA = Path(__file__).resolve().parents[1] / "formats/examples/llamafactory/examples/train_lora/llama3_lora_sft.yaml"


def lines_of(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def phased_loop(path, steps=4, every=1):
    """A real CPU training step with its phases marked; the optimizer phase also holds a TEMP-byte temporary."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1000))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with MemoryMonitor(path, cpu_step_peaks=True, every=every) as mon:
        for _ in range(steps):
            x = torch.randint(0, 1000, (8, 64))
            mon.phase("forward")
            loss = nn.functional.cross_entropy(model(x).view(-1, 1000), x.view(-1))
            mon.phase("backward")
            loss.backward()
            with mon.phase("optimizer_step"):
                opt.step()
                scratch = torch.ones(TEMP // 4)  # float32: TEMP bytes, every page written
                del scratch
            opt.zero_grad(set_to_none=True)
            mon.step(tokens=x.numel())
    return mon


def test_a_cpu_loops_phase_peaks_show_the_optimizers_temporary_in_its_phase_only(tmp_path):
    mon = phased_loop(tmp_path / "run.jsonl")
    lines = lines_of(tmp_path / "run.jsonl")
    assert mon.errors == 0 and [x["step"] for x in lines] == [1, 2, 3, 4]
    for before, x in zip([None] + lines, lines):
        p = x["phase_peaks"]
        assert set(p) == {"forward", "backward", "optimizer_step"}
        # the temporary is in the optimizer's peak and in no other phase's
        assert p["optimizer_step"] - max(p["forward"], p["backward"]) > 0.9 * TEMP
        # a phase's high-water mark starts from what is resident when it begins: backward's from the activations
        # forward left; every phase's from the steady memory (weights, Adam's states from the first step on)
        # resident at the previous step's end (malloc may hand back a few pages in between: 2%)
        assert p["backward"] >= p["forward"]
        if before is not None:
            assert min(p.values()) >= 0.98 * before["host_rss_bytes"]
        # the step's peak is its highest phase's (the marks reset the counter, the line must not lose it)
        assert x["host_peak_rss_bytes"] == max(p.values())


def test_without_marks_no_phase_peaks_and_every_n_keeps_the_highest(tmp_path):
    with MemoryMonitor(tmp_path / "plain.jsonl") as mon:
        for _ in range(3):
            torch.ones(1000).sum()
            mon.step()
    assert all("phase_peaks" not in x for x in lines_of(tmp_path / "plain.jsonl"))
    phased_loop(tmp_path / "every.jsonl", steps=4, every=2)
    every = lines_of(tmp_path / "every.jsonl")
    assert [x["step"] for x in every] == [2, 4]
    assert all(x["phase_peaks"]["optimizer_step"] - x["phase_peaks"]["forward"] > 0.9 * TEMP for x in every)


def test_an_unknown_phase_turns_the_monitor_off_not_the_training(tmp_path, capsys):
    done = 0
    with MemoryMonitor(tmp_path / "run.jsonl") as mon:
        for _ in range(3):
            with mon.phase("fwd"):
                torch.ones(8).sum()
            mon.step()
            done += 1
    assert done == 3 and mon.disabled and mon.errors == 1
    assert "unknown phase 'fwd'" in capsys.readouterr().err


def test_cuda_phase_peaks_and_the_steps_peak_from_torchs_counters(tmp_path, monkeypatch):
    """No GPU here: torch.cuda's allocator counters stood in by a fake whose peak the loop sets, to check what is
    read and reset at each mark (the arithmetic, not the GPU)."""
    state = {"peak": 0}
    cuda = types.SimpleNamespace(max_memory_allocated=lambda: state["peak"],
                                 reset_peak_memory_stats=lambda: state.update(peak=0))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(probes, "cuda_in_use", lambda: True)
    monkeypatch.setattr(probes, "cuda_total_bytes", lambda: 80 * GiB)
    monkeypatch.setattr(probes, "cuda_sample", lambda: {"allocated_bytes": GiB, "reserved_bytes": 9 * GiB,
                                                        "peak_allocated_bytes": state["peak"],
                                                        "device_used_bytes": 10 * GiB})
    with MemoryMonitor(tmp_path / "run.jsonl") as mon:
        for step, (f, b, o) in enumerate([(5, 7, 6), (4, 8, 3)]):
            mon.phase("forward")
            state["peak"] = f * GiB
            mon.phase("backward")
            state["peak"] = b * GiB
            mon.phase("optimizer_step")
            state["peak"] = o * GiB
            mon.end_phase()
            state["peak"] = 2 * GiB  # zero_grad and the scheduler: in the step's peak only
            mon.step()
    a, b = lines_of(tmp_path / "run.jsonl")
    assert mon.errors == 0
    assert a["phase_peaks"] == {"forward": 5 * GiB, "backward": 7 * GiB, "optimizer_step": 6 * GiB}
    assert b["phase_peaks"] == {"forward": 4 * GiB, "backward": 8 * GiB, "optimizer_step": 3 * GiB}
    assert (a["peak_allocated_bytes"], b["peak_allocated_bytes"]) == (7 * GiB, 8 * GiB)


def test_hf_trainer_callback_writes_the_phases_it_can_see(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from memfit.monitor import MemoryMonitorCallback

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (8, 16))]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2,
                             gradient_accumulation_steps=2, use_cpu=True, report_to=[], save_strategy="no",
                             logging_strategy="no", dataloader_num_workers=0)
    cb = MemoryMonitorCallback(tmp_path / "run.jsonl")
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=rows, callbacks=[cb]).train()
    lines = lines_of(tmp_path / "run.jsonl")
    assert cb.monitor.errors == 0 and [x["step"] for x in lines] == [1, 2]
    for x in lines:
        assert set(x["phase_peaks"]) == {"forward", "backward", "optimizer_step"}
        assert all(v > 0 for v in x["phase_peaks"].values())
        assert x["tokens"] == 2 * 2 * 16  # both micro-batches counted


# ---- memfit watch: by phase against the estimate, and bad phase_peaks -------------------------------------


def cuda_line(step, rank, phase_peaks):
    return json.dumps({"schema": "memfit.monitor/1", "rank": rank, "world_size": 2, "step": step, "time": 1.0,
                       "step_seconds": 1.0, "tokens": 2048, "device_kind": "cuda", "allocated_bytes": 15 * GiB,
                       "reserved_bytes": 25 * GiB, "peak_allocated_bytes": max(phase_peaks.values()),
                       "device_used_bytes": 26 * GiB, "device_total_bytes": 80 * GiB, "host_rss_bytes": 8 * GiB,
                       "phase_peaks": phase_peaks}) + "\n"


def test_watch_compares_each_marked_phase_with_the_estimate(tmp_path, watch, watch_json, capsys):
    from memfit.interfaces.cli.main import main

    assert main(["estimate", "--from", str(LF_LORA), "--gpu-mem", "80GiB", "--gpus", "2", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["per_rank"]["allocated"]["phases"]
    fwd, bwd = est["forward"]["total"], est["backward"]["total"]
    # rank 1 step 2 holds the run's highest forward (10% over the estimate); backward stays 20% under; the
    # optimizer phase is not marked; a line without phase_peaks (an unmarked step) is read too
    peaks = {(0, 1): (fwd // 2, bwd * 8 // 10), (0, 2): (fwd // 3, bwd // 2),
             (1, 1): (fwd // 2, bwd // 2), (1, 2): (fwd * 11 // 10, bwd // 3)}
    for rank in (0, 1):
        text = "".join(cuda_line(s, rank, {"forward": peaks[rank, s][0], "backward": peaks[rank, s][1]})
                       for s in (1, 2))
        text += cuda_line(3, rank, {"forward": GiB}).replace(', "phase_peaks": {"forward": 1073741824}', "")
        (tmp_path / f"run.rank{rank}.jsonl").write_text(text)
    doc = watch_json(tmp_path / "run.jsonl", "--estimate-from", str(LF_LORA))
    by_phase = doc["vs_estimate"]["by_phase"]
    assert [r["phase"] for r in by_phase] == ["forward", "backward"]
    f, b = by_phase
    assert f == {"phase": "forward", "estimate_bytes": fwd, "measured_bytes": fwd * 11 // 10,
                 "error_pct": round(100 * (fwd - fwd * 11 // 10) / (fwd * 11 // 10), 2), "under_predicted": True}
    assert b == {"phase": "backward", "estimate_bytes": bwd, "measured_bytes": bwd * 8 // 10,
                 "error_pct": round(100 * (bwd - bwd * 8 // 10) / (bwd * 8 // 10), 2), "under_predicted": False}
    code, out, _ = watch(tmp_path / "run.jsonl", "--estimate-from", str(LF_LORA))
    assert code == 0
    assert f"forward (allocated peak of the phase): measured {fwd * 11 // 10 / GiB:,.3f} GiB" in out
    assert "UNDER-predicted" in out.split("forward (allocated")[1].splitlines()[0]
    assert "covered" in out.split("backward (allocated")[1].splitlines()[0]


def test_a_run_without_phase_marks_has_no_by_phase(tmp_path, watch_json):
    line = cuda_line(1, 0, {"forward": GiB}).replace(', "phase_peaks": {"forward": 1073741824}', "")
    (tmp_path / "run.jsonl").write_text(line)
    vs = watch_json(tmp_path / "run.jsonl", "--estimate-from", str(LF_LORA), "--gpu", "a100-80gb")["vs_estimate"]
    assert vs["available"] and "by_phase" not in vs


@pytest.mark.parametrize("peaks, says", [
    ([1, 2], "phase_peaks must be an object"),
    ({"fwd": 1}, "phase_peaks has unknown phase 'fwd'"),
    ({"forward": -1}, "phase_peaks['forward'] must be a whole number"),
    ({"forward": 1.5}, "phase_peaks['forward'] must be a whole number"),
    ({"forward": True}, "phase_peaks['forward'] must be a whole number"),
])
def test_a_malformed_phase_peaks_is_one_line(tmp_path, watch, peaks, says):
    good = cuda_line(1, 0, {"forward": GiB})
    bad = json.loads(cuda_line(2, 0, {"forward": GiB}))
    (tmp_path / "run.jsonl").write_text(good + json.dumps({**bad, "phase_peaks": peaks}) + "\n")
    code, out, err = watch(tmp_path / "run.jsonl")
    assert code == 2 and out == ""
    assert err.startswith("memfit: error: ") and err.count("\n") == 1 and f"run.jsonl:2: {says}" in err, err
