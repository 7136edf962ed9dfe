"""Ground truth on a real GPU: memory and step time of real training steps, one JSON line per configuration.

    python bench/cuda_truth.py --out RESULTS.jsonl [--budget-s 300] [--only ID,ID] [--resume]
    python bench/cuda_truth.py --device cpu --tiny --out RESULTS.jsonl        # the same code, tiny models, no CUDA
    python bench/cuda_truth.py --compare RESULTS.jsonl [--json]               # memfit's estimate beside each row

Each configuration is memfit CLI arguments (ROWS below), so the same row drives the measurement and memfit's estimate.
The model is built from memfit's catalog with random weights on the device and trained as HF Trainer does
(bench/cuda_truth_run.py says which calls). A row records max_memory_allocated / reserved, the device used
(torch.cuda.mem_get_info, NVML), the phase of the peak, the median step time after warm-up and tokens/s, the
library versions, the CUDA context and cuBLAS workspace, and for flagged rows the allocations live at the peak.
Rows are appended and flushed one at a time, so a run cut short keeps what it measured; an OOM is a row too.
On the CPU every CUDA reading is null. bench/cuda_truth_device.sh runs it on the GPU machine.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cuda_truth_run, the measuring half

from memfit.errors import MemfitError  # noqa: E402

SCHEMA = "memfit.cuda_truth/1"
GPU = ["--gpu", "h200"]
L1, L3, L8 = "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.1-8B"
Q15, Q3, Q7 = "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B"


def _row(row_id: str, group: str, model: str, *args: str, history: bool = False) -> dict:
    return {"id": row_id, "group": group, "args": [model, *GPU, *args], "history": history}


def _knobs(tuning: str, mb: int, seq: int, *more: str) -> list[str]:
    return ["--tuning", tuning, "--micro-batch", str(mb), "--seq", str(seq), *more]


# Most informative first (a cut-short run keeps the head): QLoRA vs LoRA on one model, checkpointing on/off, the batch
# and length sweeps, full fine-tunes of 1-3B models, then kernels, losses and the slowest rows.
ROWS = [
    _row("l8-qlora-mb2-s2048-ckpt", "qlora-vs-lora", L8, *_knobs("qlora", 2, 2048, "--ckpt"), history=True),
    _row("l8-lora-mb2-s2048-ckpt", "qlora-vs-lora", L8, *_knobs("lora", 2, 2048, "--ckpt"), history=True),
    _row("q7-qlora-mb1-s4096-ckpt", "qlora-vs-lora", Q7, *_knobs("qlora", 1, 4096, "--ckpt")),
    _row("q7-lora-mb1-s4096-ckpt", "qlora-vs-lora", Q7, *_knobs("lora", 1, 4096, "--ckpt")),
    _row("l1-qlora-mb4-s1024", "qlora-vs-lora", L1, *_knobs("qlora", 4, 1024)),
    _row("l1-lora-mb4-s1024", "qlora-vs-lora", L1, *_knobs("lora", 4, 1024)),
    _row("l3-lora-mb2-s2048", "checkpointing", L3, *_knobs("lora", 2, 2048)),
    _row("l3-lora-mb2-s2048-ckpt", "checkpointing", L3, *_knobs("lora", 2, 2048, "--ckpt")),
    _row("q15-lora-mb4-s2048", "checkpointing", Q15, *_knobs("lora", 4, 2048)),
    _row("q15-lora-mb4-s2048-ckpt", "checkpointing", Q15, *_knobs("lora", 4, 2048, "--ckpt")),
    _row("l8-qlora-mb2-s2048", "checkpointing", L8, *_knobs("qlora", 2, 2048)),
    _row("l1-lora-mb1-s2048-ckpt", "batch-sweep", L1, *_knobs("lora", 1, 2048, "--ckpt")),
    _row("l1-lora-mb2-s2048-ckpt", "batch-sweep", L1, *_knobs("lora", 2, 2048, "--ckpt")),
    _row("l1-lora-mb4-s2048-ckpt", "batch-sweep", L1, *_knobs("lora", 4, 2048, "--ckpt")),
    _row("l1-lora-mb8-s2048-ckpt", "batch-sweep", L1, *_knobs("lora", 8, 2048, "--ckpt")),
    _row("l1-lora-mb1-s512-ckpt", "length-sweep", L1, *_knobs("lora", 1, 512, "--ckpt")),
    _row("l1-lora-mb1-s1024-ckpt", "length-sweep", L1, *_knobs("lora", 1, 1024, "--ckpt")),
    _row("l1-lora-mb1-s4096-ckpt", "length-sweep", L1, *_knobs("lora", 1, 4096, "--ckpt")),
    _row("l1-lora-mb1-s8192-ckpt", "length-sweep", L1, *_knobs("lora", 1, 8192, "--ckpt")),
    _row("l1-full-mb4-s1024", "full", L1, *_knobs("full", 4, 1024), history=True),
    _row("q15-full-mb2-s2048-ckpt", "full", Q15, *_knobs("full", 2, 2048, "--ckpt")),
    _row("l3-full-mb2-s2048-ckpt", "full", L3, *_knobs("full", 2, 2048, "--ckpt")),
    _row("l3-full-mb2-s2048-ckpt-foreach", "full", L3,
         *_knobs("full", 2, 2048, "--ckpt", "--optimizer", "adamw-foreach")),
    _row("l1-lora-mb2-s2048-eager", "attention", L1, *_knobs("lora", 2, 2048, "--attn", "eager")),
    _row("l1-lora-mb2-s2048-packed", "attention", L1, *_knobs("lora", 2, 2048, "--padding", "packed")),
    _row("l1-lora-mb2-s2048-flash-packed", "attention", L1,
         *_knobs("lora", 2, 2048, "--attn", "flash", "--padding", "packed")),
    _row("l1-lora-mb2-s2048-liger", "loss", L1, *_knobs("lora", 2, 2048, "--loss", "liger")),
    _row("l8-lora-mb2-s2048-ckpt-liger", "loss", L8, *_knobs("lora", 2, 2048, "--ckpt", "--loss", "liger")),
    _row("l3-lora-mb4-s4096-ckpt-reentrant", "checkpointing", L3, *_knobs("lora", 4, 4096, "--ckpt", "--reentrant")),
    _row("q3-qlora-mb4-s2048-ckpt", "qlora-vs-lora", Q3, *_knobs("qlora", 4, 2048, "--ckpt")),
    _row("q3-lora-mb4-s2048-ckpt", "qlora-vs-lora", Q3, *_knobs("lora", 4, 2048, "--ckpt")),
    _row("l8-qlora-mb8-s4096-ckpt", "qlora-vs-lora", L8, *_knobs("qlora", 8, 4096, "--ckpt")),
    _row("l8-lora-mb4-s8192-ckpt", "length-sweep", L8, *_knobs("lora", 4, 8192, "--ckpt")),
    _row("l8-full-mb1-s2048-ckpt", "full", L8, *_knobs("full", 1, 2048, "--ckpt")),
    _row("q7-full-mb1-s4096-ckpt", "full", Q7, *_knobs("full", 1, 4096, "--ckpt")),
]

# --tiny: every row's model shrunk to this (family, tuning and knobs kept), its length divided by TINY_SEQ_DIVISOR
TINY = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
            vocab_size=512, published_params=None)
TINY_SEQ_DIVISOR = 64


# ---------------------------------------------------------------------------------------------- scenarios
def scenario_of(args: list[str], tiny: bool):
    """The memfit Scenario of a row, as `memfit estimate ARGS` reads it (shrunk with --tiny)."""
    from memfit.interfaces.cli.main import build_parser, scenario_from_args

    s = scenario_from_args(build_parser().parse_args(["estimate", *args]))
    if not tiny:
        return s
    return replace(s, model=replace(s.model, **TINY), seq_len=max(8, s.seq_len // TINY_SEQ_DIVISOR))


def rows_wanted(only: str | None) -> list[dict]:
    if not only:
        return ROWS
    ids = [x.strip() for x in only.split(",") if x.strip()]
    known = {r["id"]: r for r in ROWS}
    unknown = [x for x in ids if x not in known]
    if unknown:
        raise MemfitError(f"--only: no row {', '.join(unknown)}; rows: {', '.join(known)}")
    return [known[x] for x in ids]


# ---------------------------------------------------------------------------------------------- measuring
def read_rows(path: Path) -> list[dict]:
    """Rows of a results file: JSON lines, or one JSON document (a list, or {"rows": [...]}) as committed."""
    if not path.is_file():
        raise MemfitError(f"{path}: no such results file; measure first: python bench/cuda_truth.py --out {path}")
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        return doc.get("rows", [doc])
    rows = []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if n == len(lines) and not text.endswith("\n"):
                    break  # the row being written when the run was cut: not measured, so not a row
                raise MemfitError(f"{path}:{n} is not a JSON line; delete that line") from None
    return rows


def _trim_partial_line(path: Path) -> None:
    """A run killed mid-write leaves half a line; appending after it would spoil the next row too."""
    text = path.read_text()
    if text and not text.endswith("\n"):
        path.write_text(text[:text.rfind("\n") + 1])


def run(a) -> int:
    import torch

    from cuda_truth_run import Nvml, free_device, run_facts

    if a.steps is not None and a.steps < 2:
        raise MemfitError(f"--steps {a.steps}: at least 2 (the first is a warm-up)")
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MemfitError("no CUDA device here: run on the GPU machine (bench/cuda_truth_device.sh) or "
                          "use --device cpu --tiny")
    if device.type == "cpu" and not a.tiny:
        raise MemfitError("--device cpu runs tiny models only: add --tiny")
    out = Path(a.out)
    if out.exists():
        _trim_partial_line(out)
    kept = read_rows(out) if a.resume and out.exists() else []
    done = {r["id"] for r in kept if r.get("outcome") in ("ok", "oom")}
    facts = run_facts(device)
    nvml = Nvml(device.index or 0)
    steps = a.steps or (4 if device.type == "cuda" else 2)
    started = time.perf_counter()
    written = 0
    with out.open("a") as f:
        for spec in rows_wanted(a.only):
            if spec["id"] in done:
                continue
            # checked between rows: the first row always runs, however slow the start-up before it was
            if written and time.perf_counter() - started >= a.budget_s:
                print(f"budget of {a.budget_s:g} s spent: {written} rows written, the rest not started", flush=True)
                break
            row = _measure(spec, a.tiny, device, steps, nvml, facts)
            row["left_allocated"] = free_device(device)
            f.write(json.dumps(row) + "\n")
            f.flush()
            written += 1
            print(_progress(row), flush=True)
    print(f"{written} rows in {out}; next: python bench/cuda_truth.py --compare {out}")
    return 0


def _measure(spec: dict, tiny: bool, device, steps: int, nvml, facts: dict) -> dict:
    """One row; whatever goes wrong in it is the row's outcome, and the next row runs."""
    import traceback

    import torch

    from cuda_truth_run import Unavailable, measure_row

    row = {"schema": SCHEMA, "id": spec["id"], "group": spec["group"], "args": spec["args"], "tiny": tiny,
           "device": str(device), "steps": steps, "warmup_steps": 1, "history_requested": spec["history"],
           "outcome": "ok", "reason": None}
    t = time.perf_counter()
    try:
        s = scenario_of(spec["args"], tiny)
        row["model"] = {"id": s.model.id, "layers": s.model.num_layers, "hidden": s.model.hidden_size,
                        "vocab": s.model.vocab_size, "seq_len": s.seq_len, "micro_batch": s.micro_batch}
        row |= measure_row(s, device, steps, spec["history"], nvml)
    except torch.OutOfMemoryError as e:
        row |= getattr(e, "partial", {}) | {"outcome": "oom", "reason": str(e).splitlines()[0][:300]}
    except Unavailable as e:
        row |= {"outcome": "unavailable", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - one broken configuration must not cost the rows after it
        row |= {"outcome": "error", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "traceback": traceback.format_exc().splitlines()[-16:]}  # the device run is one shot: where it broke
    row["wall_s"] = round(time.perf_counter() - t, 3)
    row["run"] = facts
    return row


def _progress(row: dict) -> str:
    if row["outcome"] != "ok":
        return f"{row['id']:<36} {row['outcome']}: {row['reason']}"
    alloc = row.get("max_memory_allocated")
    memory = f"{alloc / 2**30:7.2f} GiB allocated at {row['peak_phase']}" if alloc is not None else "memory: n/a (CPU)"
    return f"{row['id']:<36} {memory}, {row['tokens_per_s']:,.0f} tokens/s, {row['wall_s']:.1f} s"


# ---------------------------------------------------------------------------------------------- compare
STEP_PHASES = ("forward", "backward", "optimizer_step")


def predicted_speed(s) -> dict:
    """memfit's speed model for `s` (memfit/planner/step_time.py step_time): one optimizer step's seconds and its
    tokens/s; read through this one function because the speed model is being rewritten."""
    try:
        from memfit.planner.step_time import step_time

        result = step_time(s)
    except Exception as e:  # noqa: BLE001 - a speed model mid-rewrite must not stop the memory comparison
        return {"seconds": None, "tokens_per_s": None, "reason": f"{type(e).__name__}: {e}"}
    data = result.to_json() if hasattr(result, "to_json") else dict(result)
    seconds = getattr(result, "seconds", None) or data.get("step_seconds") or data.get("seconds")
    tokens = getattr(result, "tokens_per_second", None) or data.get("tokens_per_second")
    return {"seconds": seconds, "tokens_per_s": tokens, "reason": None}


def _step_peak(profile) -> tuple[int, str]:
    """memfit's peak over the three measured phases (load / checkpoint phases are not run here)."""
    phases = {p: b.total for p, b in profile.phases.items() if p in STEP_PHASES}
    phase = max(phases, key=lambda p: (phases[p], -STEP_PHASES.index(p)))
    return phases[phase], phase


def measured_device_total(row: dict) -> int | None:
    """What this process added to the device (the nvidia-smi number): NVML's used at the peak minus NVML's used before
    torch made its context (one source on both sides)."""
    used, before = row.get("nvml_used"), (row.get("run") or {}).get("device_used_before_torch")
    return None if used is None or before is None else used - before


def compare_row(row: dict) -> dict:
    from memfit.roles.estimate import estimate

    s = scenario_of(row["args"], row.get("tiny", False))
    e = estimate(s)
    alloc, phase = _step_peak(e.allocated)
    reserved, _ = _step_peak(e.reserved)
    device, _ = _step_peak(e.device_total)
    speed = predicted_speed(s)
    measured_tps = row.get("tokens_per_s")
    # memfit's tokens/s counts a padded batch at its fill assumption; the bench's batch is full but for one token,
    # so the predicted rate is the bench's tokens over memfit's step seconds
    tokens = row.get("tokens_per_step")
    predicted_tps = tokens / speed["seconds"] if speed["seconds"] and tokens else None
    return {"id": row["id"], "group": row.get("group"), "outcome": row["outcome"], "tuning": s.tuning,
            "gpus": s.hardware.world_size, "device": row.get("device"), "history": row.get("history_requested"),
            "allocated": (row.get("max_memory_allocated"), alloc),
            "reserved": (row.get("max_memory_reserved"), reserved),
            "device_total": (measured_device_total(row), device), "peak_phase": (row.get("peak_phase"), phase),
            "tokens_per_s": (measured_tps, predicted_tps), "speed_reason": speed["reason"], "verdict": e.verdict}


def real_rows(path: Path) -> list[dict]:
    """The measured rows as bench/real_runs.py's RealRow fields (the error bands' real GPU runs): device total on
    the H200 against memfit's device total at the step's peak; an OOM bounds the need from below by the card."""
    from memfit.facts.error_bands import kind_of
    from memfit.roles.estimate import estimate

    out = []
    for row in read_rows(path):
        if not str(row.get("device", "")).startswith("cuda") or row.get("outcome") not in ("ok", "oom"):
            continue
        s = scenario_of(row["args"], False)
        total = estimate(s).device_total.peak.total
        measured = measured_device_total(row) if row["outcome"] == "ok" else s.hardware.gpu.memory_bytes
        if measured is None:
            continue
        out.append({"id": row["id"], "source": "cuda_h200", "kind": kind_of(s), "group": row["id"],
                    "basis": "device_total" if row["outcome"] == "ok" else "oom", "estimate": total,
                    "excess": int(measured - total), "model": s.model.id})
    return out


def _err(pair) -> float | None:
    measured, est = pair
    return None if not measured or est is None else est / measured - 1


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation (average ranks for ties)."""
    if len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else None


def summary(compared: list[dict]) -> dict:
    """The issue's two checks: device total within 5% on single-GPU LoRA / QLoRA / full rows; predicted vs measured
    tokens/s (rank correlation, median ratio) over every timed row."""
    ok = [c for c in compared if c["outcome"] == "ok"]
    judged = [c for c in ok if c["gpus"] == 1 and c["tuning"] in ("lora", "qlora", "full")]
    errors = {c["id"]: _err(c["device_total"]) for c in judged}
    measured = {k: v for k, v in errors.items() if v is not None}
    timed = [c for c in ok if all(c["tokens_per_s"])]
    ratios = [c["tokens_per_s"][1] / c["tokens_per_s"][0] for c in timed]
    return {"rows": len(compared), "ok": len(ok), "device_total_rows": len(measured),
            "device_total_within_5pct": sum(abs(v) <= 0.05 for v in measured.values()),
            "device_total_beyond_5pct": sorted(k for k, v in measured.items() if abs(v) > 0.05),
            "device_total_unmeasured": sorted(k for k, v in errors.items() if v is None),
            "speed_rows": len(timed),
            "speed_rank_correlation": spearman(*zip(*(c["tokens_per_s"] for c in timed))) if timed else None,
            "speed_median_ratio": statistics.median(ratios) if ratios else None,
            "devices": sorted({c["device"] for c in compared if c["device"]})}


def _gib(x) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def print_compare(compared: list[dict], summ: dict, rows: list[dict]) -> None:
    rho, med = summ["speed_rank_correlation"], summ["speed_median_ratio"]
    print(f"device total within 5%: {summ['device_total_within_5pct']} of {summ['device_total_rows']} single-GPU "
          f"LoRA / QLoRA / full rows measured" + (f"; beyond: {', '.join(summ['device_total_beyond_5pct'])}"
                                                 if summ["device_total_beyond_5pct"] else ""))
    print(f"speed: predicted vs measured tokens/s over {summ['speed_rows']} rows: rank correlation "
          f"{'-' if rho is None else f'{rho:.2f}'}, median ratio {'-' if med is None else f'{med:.2f}'}")
    print()
    print("memfit's estimate beside each measured row (err = estimate / measured - 1; peak over forward, backward and "
          "the optimizer step)")
    print(f"{'row':<34} {'outcome':<11} {'alloc GiB meas/est':>20} {'err':>7} {'reserved meas/est':>19} {'err':>7} "
          f"{'device meas/est':>17} {'err':>7} {'peak meas/est':>25} {'tok/s meas/pred':>19} {'ratio':>6}")
    for c in compared:
        (ma, ea), (mr, er), (md, ed) = c["allocated"], c["reserved"], c["device_total"]
        (mp, ep), (mt, pt) = c["peak_phase"], c["tokens_per_s"]
        ratio = f"{pt / mt:.2f}" if mt and pt else "-"
        tps = f"{mt:,.0f}/{pt:,.0f}" if mt and pt else f"{mt:,.0f}/-" if mt else "-"
        print(f"{c['id'][:34]:<34} {c['outcome']:<11} {_gib(ma) + '/' + _gib(ea):>20} {_pct(_err(c['allocated'])):>7} "
              f"{_gib(mr) + '/' + _gib(er):>19} {_pct(_err(c['reserved'])):>7} {_gib(md) + '/' + _gib(ed):>17} "
              f"{_pct(_err(c['device_total'])):>7} {(mp or '-') + '/' + ep:>25} {tps:>19} {ratio:>6}")
    print()
    for c, row in zip(compared, rows):
        if c["outcome"] != "ok":
            print(f"{c['id']}: {c['outcome']} (memfit's verdict: {c['verdict']}): {row.get('reason')}")
        for site in ((row.get("history") or {}).get("top_sites") or [])[:3]:
            print(f"{c['id']}: at the peak {_gib(site['bytes'])} GiB in {site['blocks']} blocks: {site['site']}")
    _print_versions(rows)
    if "cpu" in summ["devices"]:
        print("these rows ran on the CPU with tiny models: memory readings are null and the speed ratio compares a "
              "CPU with memfit's GPU model; only a CUDA run's numbers are evidence")
    print("next: a row beyond 5% names the fact memfit misses (its notes and top allocations in the results say "
          "where), to be derived from the library source and filed with its issue")


def _print_versions(rows: list[dict]) -> None:
    from memfit.facts.versions import pinned, release

    got = (rows[0].get("run") or {}).get("versions", {}) if rows else {}
    others = [f"{k} {got[k]} (facts: {pin})" for k, pin in pinned().items() if got.get(k) and release(got[k]) != pin]
    extras = ", ".join(f"{k} {got.get(k)}" for k in ("bitsandbytes", "liger-kernel", "cuda") if got.get(k))
    on = ", ".join(others) if others else "memfit's pinned releases"
    print(f"measured on: {on}" + (f"; {extras}" if extras else ""))


def compare(a) -> int:
    rows = list({r["id"]: r for r in read_rows(Path(a.compare))}.values())  # a resumed run's retried row: the last
    if not rows:
        raise MemfitError(f"{a.compare} holds no rows; run python bench/cuda_truth.py --out {a.compare} first")
    compared = [compare_row(r) for r in rows]
    summ = summary(compared)
    if a.json:
        print(json.dumps({"rows": compared, "summary": summ}))
    else:
        print_compare(compared, summ, rows)
    return 0


# ---------------------------------------------------------------------------------------------- CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="cuda_truth.jsonl", help="JSON lines file the rows are appended to")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="shrink every model to 2 layers x 64 hidden, lengths / 64")
    p.add_argument("--budget-s", type=float, default=math.inf,
                   help="start no further row after this many seconds (the first row always runs)")
    p.add_argument("--steps", type=int, help="steps per row, the first a warm-up (default 4 on CUDA, 2 on the CPU)")
    p.add_argument("--only", help="comma-separated row ids (default: every row, in order)")
    p.add_argument("--resume", action="store_true", help="skip rows --out already holds as ok or oom")
    p.add_argument("--list", action="store_true", help="print the row ids and arguments, then stop")
    p.add_argument("--compare", metavar="RESULTS", help="print memfit's estimate beside each row of RESULTS")
    p.add_argument("--json", action="store_true", help="with --compare: the rows and the summary as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        if a.list:
            for r in ROWS:
                print(f"{r['id']:<36} {' '.join(r['args'])}")
            return 0
        return compare(a) if a.compare else run(a)
    except MemfitError as e:
        print(f"cuda_truth: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
