"""Derive the caching allocator's slack (reserved - allocated) for traced training steps, by replaying them.

    python -m memfit.trace.allocator_facts            # rewrite memfit/facts/data/allocator_slack.toml
    python -m memfit.trace.allocator_facts --check    # exit 1 when the installed torch/transformers disagree

Each row: one scenario's step stream (memfit.trace.step_stream, traced at three lengths up to max_len, checked
at a fourth) replayed through the allocator (memfit.trace.allocator) with no model states and no capacity
limit, so the slack is the cache's own: over `STEPS` steps of the maximum length ("uniform"), and over
`STEPS` steps of sampled lengths for each of `SEEDS` ranks ("varying", allocator_study.sample_lengths).
Slack is given as a share of the step's churn peak (the stream's own allocated peak). A study of ZeRO-3 DPO steps
of varying length: the estimate reads the whole-run replays of allocator_reserve.py (data/allocator_reserve.toml).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from memfit.trace.allocator import DEFAULT_RULES, TORCH_VERSION
from memfit.trace.allocator_study import Spec, spec_scenario
from memfit.trace.fact_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "facts" / "data" / "allocator_slack.toml"
STEPS, SEEDS = 100, (0, 1, 2, 3)


SPECS = (
    Spec("THUDM/glm-4-9b-chat", "eager", 2048),
    Spec("THUDM/glm-4-9b-chat", "flash", 2048),
    Spec("THUDM/glm-4-9b-chat", "eager", 2048, layers=2),  # tests/trace/test_allocator.py re-derives this row
)


def derive_row(spec: Spec) -> dict:
    from memfit.trace.allocator_study import length_model, sample_lengths, simulate

    model = length_model(spec_scenario(spec))
    uniform = simulate(model, [spec.max_len] * STEPS)
    churn = uniform.peak_allocated

    def share(run) -> float:
        return round((run.peak_reserved - run.peak_allocated) / churn, 3)

    varying = [share(simulate(model, sample_lengths(STEPS, spec.max_len, seed=s))) for s in SEEDS]
    return {"churn_peak_bytes": churn, "uniform": share(uniform), "varying": varying,
            "varying_median": round(statistics.median(varying), 3), "varying_max": max(varying)}


def render(rows: dict[str, dict]) -> str:
    import transformers

    from memfit.trace.allocator_study import MEDIAN_TOKENS, SIGMA

    r = DEFAULT_RULES
    lines = ["# Caching-allocator slack of traced training steps: (peak reserved - peak allocated) / the step's churn peak.",
             "# Written by `python -m memfit.trace.allocator_facts` (memfit/trace/allocator.py replays c10's",
             "# CUDACachingAllocator rules over the recorded allocation stream); do not edit.",
             f'torch = "{TORCH_VERSION}"', f'transformers = "{transformers.__version__}"',
             f"# allocator constants: block {r.min_block}, small <= {r.small_size}, small segment {r.small_buffer}, "
             f"large segment {r.large_buffer} below {r.min_large_alloc}, rounding {r.round_large}",
             f"steps = {STEPS}", f"seeds = {list(SEEDS)}",
             f"# varying: per-step lengths log-normal, median {MEDIAN_TOKENS} tokens, sigma {SIGMA}, cut at max_len", ""]
    for key, row in rows.items():
        lines.append(f'["{key}"]')
        lines += [f"{name} = {value!r}" for name, value in row.items()]
        lines.append("")
    return "\n".join(lines)


def derived_text() -> str:
    return render({spec.key: derive_row(spec) for spec in SPECS})


def main(argv: list[str] | None = None) -> int:
    return write_or_check("Derive the caching allocator's slack by replaying traced steps.", OUT,
                          derived_text, "torch/transformers", argv)


if __name__ == "__main__":
    sys.exit(main())
