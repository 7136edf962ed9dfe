"""Fit the calibrated constants of memfit/facts/data/speed.toml on measured throughput, and measure the bands.

    HF_HUB_OFFLINE=1 python tools/calibrate_speed.py [--cases FILE]

Only constants no machine here can measure are fitted, one value each (never a factor per source or per row):
- absolute, by least squares on log(predicted / measured tokens/s) over the fit half of the rows (bench/throughput.py
  `held_out` is the other half) that ran nothing memfit leaves out (torch.compile, FOAK kernels, dynamic padding)
  and that report tokens/s (deepspeed-issue-3901 gives seconds without its batch): the A100 family's mfu,
  [shape] half_hidden, [overhead] micro_step_seconds, [quantization] bnb / gptq seconds_per_byte and
  [comm] exposed.full_shard;
- from one pair each, where only a ratio is known: [optimizer] adamw-8bit (torchtune-flags 222 -> 223, both compiled:
  the ratio cancels compile) and [offload] host_node_gbps (deepspeed-issue-3901 235 -> 236, ZeRO-3 parameter offload).
Then the bands on the held-out rows: [band] low / high (the 10th / 90th percentile of measured / predicted) and tie
(the 80th percentile of |predicted ratio / measured ratio - 1| over pairs of one job).

Prints the values as speed.toml lines; copy them in by hand (the file keeps its comments), then rerun the bench.
"""
from __future__ import annotations

import argparse
import math
import sys
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import throughput as bench  # noqa: E402  (bench/throughput.py: the rows and their reading)

A100 = ("a100-40gb", "a100-80gb", "a100-80gb-pcie", "a800-80gb", "a800-80gb-pcie")
# (path in speed.toml, start value, upper bound); fitted in log space so every value stays positive; a share of
# time that is exposed cannot pass 1
ABSOLUTE = [(("mfu", "a100-80gb"), 0.5, 1.0), (("shape", "half_hidden"), 400.0, 1e5),
            (("overhead", "micro_step_seconds"), 0.05, 10.0),
            (("quantization", "bnb_seconds_per_byte"), 1e-11, 1e-8), (("quantization", "gptq_seconds_per_byte"), 2e-12, 1e-8),
            (("comm", "exposed", "full_shard"), 0.4, 1.0)]


def _set(path: tuple, value: float) -> None:
    from memfit.planner.speed_constants import assumptions

    table = assumptions()
    for key in path[:-1]:
        table = table[key]
    table[path[-1]] = value
    if path == ("mfu", "a100-80gb"):
        for gpu in A100:
            assumptions()["mfu"][gpu] = value
    if path == ("optimizer", "adamw-8bit"):  # the same bitsandbytes kernel, paged or not
        assumptions()["optimizer"]["paged-adamw-8bit"] = value


def _predict(rows) -> None:
    from memfit.planner.step_time import step_time

    for r in rows:
        r.predicted = step_time(r.scenario).tokens_per_second


def fit_absolute(rows) -> dict:
    import numpy as np
    from scipy.optimize import least_squares

    def residuals(x):
        for (path, _, _), v in zip(ABSOLUTE, np.exp(x)):
            _set(path, float(v))
        _predict(rows)
        return [math.log(r.ratio) for r in rows]

    start = np.log([v for _, v, _ in ABSOLUTE])
    upper = np.log([hi for _, _, hi in ABSOLUTE])
    result = least_squares(residuals, start, diff_step=1e-3, bounds=(-np.inf, upper + 1e-9))
    residuals(result.x)
    return {path: float(v) for (path, _, _), v in zip(ABSOLUTE, np.exp(result.x))}


def fit_pair(rows, a: str, b: str, path: tuple, lo: float, hi: float) -> float | None:
    """The value of `path` at which the predicted b/a ratio equals the measured one (bisection in log space)."""
    found = {r.id: r for r in rows}
    if a not in found or b not in found:
        return None
    ra, rb = found[a], found[b]
    target = rb.measured / ra.measured

    def gap(v):
        _set(path, v)
        _predict([ra, rb])
        return rb.predicted / ra.predicted - target

    if gap(lo) * gap(hi) > 0:
        return lo if abs(gap(lo)) < abs(gap(hi)) else hi
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if gap(lo) * gap(mid) <= 0:
            hi = mid
        else:
            lo = mid
    _set(path, math.sqrt(lo * hi))
    return math.sqrt(lo * hi)


def bands(rows) -> dict:
    _predict(rows)
    held = [r for r in rows if bench.held_out(r.id)]
    inverse = [1 / r.ratio for r in held]  # measured / predicted
    pairs = [abs((a.predicted / b.predicted) / (a.measured / b.measured) - 1)
             for job in {r.job for r in held}
             for a, b in combinations([r for r in held if r.job == job], 2)]
    return {"low": bench.quantile(inverse, 0.1), "high": bench.quantile(inverse, 0.9),
            "tie": bench.quantile(pairs, 0.8), "held_out_rows": len(held), "pairs": len(pairs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=Path, default=bench.CASES)
    a = p.parse_args()
    rows, _ = bench.load(a.cases)
    fit = [r for r in rows if not bench.held_out(r.id) and r.source != "deepspeed-issue-3901"
           and not r.not_modelled]  # FOAK fuses the element-wise work speed.toml [compute] counts
    values = fit_absolute(fit)
    values[("optimizer", "adamw-8bit")] = fit_pair(rows, "torchtune-flags-222", "torchtune-flags-223",
                                                   ("optimizer", "adamw-8bit"), 14.0, 400.0)
    values[("offload", "host_node_gbps")] = fit_pair(rows, "deepspeed-issue-3901-235", "deepspeed-issue-3901-236",
                                                     ("offload", "host_node_gbps"), 1.0, 400.0)
    print(f"# fitted on {len(fit)} rows; the absolute fit's log error on them: "
          f"rms {math.sqrt(sum(math.log(r.ratio) ** 2 for r in fit) / len(fit)):.3f}")
    for path, v in values.items():
        print(f"{'.'.join(path)} = {v:.3g}")
    b = bands(rows)
    print(f"# band on {b['held_out_rows']} held-out rows, tie on {b['pairs']} pairs of one job")
    print(f"band.low = {b['low']:.3g}\nband.high = {b['high']:.3g}\nband.tie = {b['tie']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
