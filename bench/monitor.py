"""Cost of memfit.monitor.MemoryMonitor on small CPU torch training loops (target: < 1% of the step).

    python bench/monitor.py [--steps 200] [--json]

Two measures per loop size: each mon.step() call timed around it (median and mean: on a shared machine the
mean also counts the calls during which the process was preempted) against the step's median time, and an A/B
of the same loop without and with the monitor, interleaved in blocks so that drift falls on both (noisier: it
bounds the cache effects the direct clock cannot see). Results on a 2-core shared box: see the report."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from memfit.monitor import MemoryMonitor  # noqa: E402

BATCH, VOCAB, HIDDEN = 8, 1000, 64
# (tokens per row, every, phases marked): steps of ~4, 10 and 40 ms here; with phases, the three marks a step
# (forward, backward, optimizer_step) count in the monitor's time
CASES = ((16, 1, False), (16, 10, False), (64, 1, False), (256, 1, False), (16, 1, True), (64, 1, True),
         (256, 1, True))


class Loop:
    def __init__(self, seq: int):
        torch.manual_seed(0)
        self.seq = seq
        self.model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.ReLU(),
                                   nn.Linear(4 * HIDDEN, VOCAB))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self, mark) -> None:
        x = torch.randint(0, VOCAB, (BATCH, self.seq))
        mark("forward")
        loss = nn.functional.cross_entropy(self.model(x).view(-1, VOCAB), x.view(-1))
        mark("backward")
        loss.backward()
        mark("optimizer_step")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class Marks:
    """mon.phase, timed; or nothing when the row marks no phase."""

    def __init__(self, mon: MemoryMonitor | None):
        self.mon, self.seconds = mon, 0.0

    def __call__(self, name: str) -> None:
        if self.mon is not None:
            t = time.perf_counter()
            self.mon.phase(name)
            self.seconds += time.perf_counter() - t


def block(loop: Loop, steps: int, mon: MemoryMonitor | None, calls: list[float], phases: bool = False) -> float:
    marks = Marks(mon if phases else None)
    begin = time.perf_counter()
    for _ in range(steps):
        marks.seconds = 0.0
        loop.step(marks)
        if mon is not None:
            t = time.perf_counter()
            mon.step(tokens=BATCH * loop.seq)
            calls.append(time.perf_counter() - t + marks.seconds)
    return (time.perf_counter() - begin) / steps


def measure(seq: int, every: int, phases: bool, steps: int, blocks: int = 6) -> dict:
    loop = Loop(seq)
    block(loop, 20, None, [])  # warm-up: first allocations, thread pools
    calls: list[float] = []
    with tempfile.TemporaryDirectory() as d, MemoryMonitor(Path(d) / "run.jsonl", every=every) as mon:
        bare, monitored = [], []
        for _ in range(blocks):
            bare.append(block(loop, steps // blocks, None, []))
            monitored.append(block(loop, steps // blocks, mon, calls, phases))
        assert mon.errors == 0 and mon.lines > 0
    # per step() call, sampled or not; the mean counts the calls during which a loaded machine preempted us,
    # the median does not
    mean, median = statistics.fmean(calls), statistics.median(calls)
    step = statistics.median(bare)
    return {"seq": seq, "every": every, "phases": phases, "step_ms": step * 1e3, "monitor_us_median": median * 1e6,
            "monitor_us_mean": mean * 1e6, "overhead_pct": 100 * median / step,
            "overhead_pct_mean": 100 * mean / step, "ab_pct": 100 * (statistics.median(monitored) - step) / step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = [measure(seq, every, phases, a.steps) for seq, every, phases in CASES]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'tokens/step':>11} {'every':>5} {'phases':>6} {'step ms':>8} {'monitor us median/mean':>22} "
          f"{'overhead % median/mean':>22} {'A/B %':>7}")
    for r in rows:
        us = f"{r['monitor_us_median']:.1f} / {r['monitor_us_mean']:.1f}"
        pct = f"{r['overhead_pct']:.2f} / {r['overhead_pct_mean']:.2f}"
        print(f"{BATCH * r['seq']:>11} {r['every']:>5} {'yes' if r['phases'] else 'no':>6} {r['step_ms']:>8.2f} {us:>22} {pct:>22} {r['ab_pct']:>7.2f}")


if __name__ == "__main__":
    main()
