"""Speed of the core: one estimate in-process (target <= 5 ms) and `memfit estimate` cold start (< 1 s).

    python bench/speed.py [--summary-json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memfit.facts.versions import installed  # noqa: E402

ARGS = ["Qwen/Qwen2-7B-Instruct", "--gpu", "rtx4090", "--gpus", "4", "--profile", "openrlhf", "--tuning", "full",
        "--zero", "3", "--micro-batch", "4", "--seq", "128", "--ckpt", "--attn", "flash"]


def estimate_ms(repeats: int = 200) -> float:
    from memfit.interfaces.cli.main import build_parser, scenario_from_args
    from memfit.roles.estimate import estimate

    scenario = scenario_from_args(build_parser().parse_args(["estimate", *ARGS]))
    estimate(scenario)  # warm the catalog caches, as a planner loop would be
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        estimate(scenario)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def cold_start_s(repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", "estimate", *ARGS, "--json"], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary-json", action="store_true")
    a = p.parse_args()
    result = {"estimate_ms_median": round(estimate_ms(), 3), "cold_start_s": round(cold_start_s(), 3)}
    if a.summary_json:
        print(json.dumps(result | {"versions": installed()}))
    else:
        print(f"{'measure':<28}{'median':>10}{'target':>10}")
        print(f"{'one estimate (in-process)':<28}{result['estimate_ms_median']:>8.2f}ms{'<= 5 ms':>10}")
        print(f"{'memfit estimate cold start':<28}{result['cold_start_s']:>9.3f}s{'< 1 s':>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
