"""A longer fuzz run of memfit's file readers and command line than tests/fuzz runs in CI.

    python bench/fuzz.py --examples 2000 [--target NAME] [--seed N]

Targets (tests/fuzz/fuzzing.py, the strategies the tests use): read_config (every importer, mutated example
files), model_config (a mutated config.json through `memfit estimate`), estimate, plan, plan_limits
(--max-seq / --max-batch), fit (argv, some with a mutated file). Prints per target: examples run, results,
one-line errors, failures (traceback, over 2 CPU seconds or hung, wrong exit code, stdout under --json on
error) and the slowest input's CPU time; then each distinct failure with one input that causes it. Exit 1 if any failure.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from fuzzing import TARGETS, warm_up  # noqa: E402


def run_target(name: str, examples: int, seed: int | None) -> list:
    strategy, runner, _ = TARGETS[name]
    outcomes = []

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=seed is None)
    @given(case=strategy)
    def collect(case):
        outcomes.append(runner(case))

    if seed is not None:
        from hypothesis import seed as with_seed

        collect = with_seed(seed)(collect)
    collect()
    return outcomes


def first_line(detail: str) -> str:
    lines = [line for line in detail.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=500, help="inputs per target (default 500)")
    p.add_argument("--target", choices=sorted(TARGETS), action="append", help="only this target (repeatable)")
    p.add_argument("--seed", type=int, help="random seed (default: derandomized, the same inputs every run)")
    a = p.parse_args()
    warm_up()
    rows, failures = [], {}
    for name in a.target or TARGETS:
        outcomes = run_target(name, a.examples, a.seed)
        count = {k: sum(o.kind == k for o in outcomes) for k in ("result", "error", "failure")}
        slowest = max(outcomes, key=lambda o: o.seconds)
        rows.append((name, len(outcomes), count["result"], count["error"], count["failure"], slowest.seconds))
        for o in outcomes:
            if o.kind == "failure":
                failures.setdefault((name, first_line(o.detail)), o)
        print(f"{name}: done ({len(outcomes)} inputs)", file=sys.stderr, flush=True)
    head = ("target", "examples", "results", "one-line errors", "failures", "slowest (CPU s)")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.2f} |")
    for (name, line), o in failures.items():
        print(f"\n[{name}] {line}\n  input: {o.input!r}"[:1500])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
