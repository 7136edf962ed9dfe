"""Derive what the caching allocator reserves beyond allocated in a whole training run, by replaying it.

    python -m memfit.trace.allocator_reserve            # rewrite memfit/facts/data/allocator_reserve.toml
    python -m memfit.trace.allocator_reserve --check    # exit 1 when the installed torch/transformers disagree

Each row: one HF Trainer SFT run on one card (allocator_study.Spec; packed rows, so every step has one shape,
checkpointing on) traced for `STEPS` whole steps (step_stream.trace_run: the parameters, then every phase's
allocations and frees, the optimizer states made by the first step) and replayed through the allocator
(memfit.trace.allocator), with no capacity limit and with the least one it runs in. Two shares of each phase's churn
come out (the factor memfit's reserved profile multiplies, memory/phases.py reserved_profile;
allocator_study.reserve_share):
- reserve_share: what the run reserves on a card with room to spare (torch.cuda.max_memory_reserved there);
- fit_share: the least reserve it runs in: below the roomy peak the allocator frees its wholly free cached
  segments and retries (R8), so only the fragmented part is needed (allocator_study.least_capacity).
Per tuning, the median fit_share over that tuning's rows is the fact the estimate reads (memfit/facts/runtime.py:
a verdict asks whether the run fits, not what a larger card would show); the median over every counted row stands
for the tunings not traced here.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from memfit.trace.allocator import DEFAULT_RULES, TORCH_VERSION
from memfit.trace.allocator_study import Spec
from memfit.trace.fact_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "facts" / "data" / "allocator_reserve.toml"
STEPS = 3  # the first step makes the optimizer states; the second and third show the steady state
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def _sft(model: str, attention: str, max_len: int, tuning: str, micro_batch: int, **adapter) -> Spec:
    return Spec(model, attention, max_len, profile="hf-trainer", method="sft", gpus=1, zero_stage=None,
                tuning=tuning, micro_batch=micro_batch, padding="packed", **adapter)


# The configurations of fms-acceleration's A100 benchmark (santacoder full, Mistral-7B full / LoRA / QLoRA, r 16 on
# q,k,v,o; Llama-2-70B QLoRA) on the pinned releases' defaults, and three other families at 2048 tokens.
SPECS = (
    _sft("bigcode/gpt_bigcode-santacoder", "flash", 2048, "full", 4),
    _sft("bigcode/gpt_bigcode-santacoder", "flash", 2048, "full", 8),
    _sft("mistralai/Mistral-7B-v0.1", "flash", 4096, "full", 4),
    _sft("meta-llama/Llama-3.2-1B", "sdpa", 2048, "full", 4),
    _sft("Qwen/Qwen2.5-1.5B", "flash", 2048, "full", 8),
    _sft("mistralai/Mistral-7B-v0.1", "flash", 4096, "lora", 4, lora_rank=16, lora_targets=QKVO),
    _sft("mistralai/Mistral-7B-v0.1", "flash", 4096, "lora", 8, lora_rank=16, lora_targets=QKVO),
    _sft("Qwen/Qwen2.5-7B", "sdpa", 2048, "lora", 2),
    _sft("mistralai/Mistral-7B-v0.1", "flash", 4096, "qlora", 4, lora_rank=16, lora_targets=QKVO),
    _sft("mistralai/Mistral-7B-v0.1", "flash", 4096, "qlora", 8, lora_rank=16, lora_targets=QKVO),
    _sft("meta-llama/Llama-3.1-8B", "sdpa", 2048, "qlora", 2),
    _sft("meta-llama/Llama-2-70b-hf", "flash", 4096, "qlora", 4, lora_rank=16, lora_targets=QKVO),
)
# re-derived by tests/trace/test_allocator_reserve.py in seconds; not counted in the medians (two layers of a model
# are not a run anyone trains)
CHECK_SPEC = Spec("Qwen/Qwen2.5-0.5B", "sdpa", 1024, layers=2, profile="hf-trainer", method="sft", gpus=1,
                  zero_stage=None, tuning="lora", micro_batch=2, padding="packed")


def derive_row(spec: Spec) -> dict:
    from memfit.trace.allocator import replay
    from memfit.trace.allocator_study import least_capacity, reserve_share, spec_scenario
    from memfit.trace.step_stream import trace_run

    stream = trace_run(spec_scenario(spec), STEPS)
    run = replay(stream.events)
    need = least_capacity(stream.events, run.peak_allocated, run.peak_reserved)
    return {"tuning": spec.tuning, "peak_allocated_bytes": run.peak_allocated, "peak_reserved_bytes": run.peak_reserved,
            "least_capacity_bytes": need, "reserve_share": round(reserve_share(stream.phases, run.peak_reserved), 3),
            "fit_share": round(reserve_share(stream.phases, need), 3)}


def summary(rows: dict[str, dict]) -> dict[str, dict]:
    """Per tuning and over all rows ("any"): the median shares."""
    groups: dict[str, list[dict]] = {"any": list(rows.values())}
    for row in rows.values():
        groups.setdefault(row["tuning"], []).append(row)
    return {name: {share: round(statistics.median(r[share] for r in group), 3) for share in ("reserve_share", "fit_share")}
            | {"rows": len(group)} for name, group in groups.items()}


def render(rows: dict[str, dict], check: tuple[str, dict]) -> str:
    import transformers

    r = DEFAULT_RULES
    lines = ["# The caching allocator's reserve beyond allocated over whole HF Trainer SFT runs on one card, as a share of",
             "# each phase's churn (activations, logits and loss, optimizer temporaries): the least share f for which",
             "# the largest phase's allocated + f x churn reaches the replayed reserve (memory/phases.py reserved_profile).",
             "# Written by `python -m memfit.trace.allocator_reserve` (memfit/trace/allocator.py replays c10's",
             "# CUDACachingAllocator rules over the traced allocation stream); do not edit.",
             f'torch = "{TORCH_VERSION}"', f'transformers = "{transformers.__version__}"',
             f"# allocator constants: block {r.min_block}, small <= {r.small_size}, small segment {r.small_buffer}, "
             f"large segment {r.large_buffer} below {r.min_large_alloc}, rounding {r.round_large}",
             f"steps = {STEPS}",
             "# reserve_share: the peak reserved with room to spare; fit_share: the least reserve the run fits in",
             "# (the allocator frees wholly free cached segments and retries before it fails)", ""]
    for name, row in summary(rows).items():
        lines.append(f"[tuning.{name}]")
        lines += [f"{k} = {v!r}" for k, v in row.items()]
        lines.append("")
    for key, row in [*rows.items(), check]:
        lines.append(f'[run."{key}"]')
        lines += [f"{k} = {v!r}" for k, v in row.items()]
        if key == check[0]:
            lines.append("counted = false  # the test's row: two layers, re-derived in seconds")
        lines.append("")
    return "\n".join(lines)


def derived_text() -> str:
    return render({s.key: derive_row(s) for s in SPECS}, (CHECK_SPEC.key, derive_row(CHECK_SPEC)))


def main(argv: list[str] | None = None) -> int:
    return write_or_check("Derive the caching allocator's reserve over whole runs by replaying traced steps.", OUT,
                          derived_text, "torch/transformers", argv)


if __name__ == "__main__":
    sys.exit(main())
