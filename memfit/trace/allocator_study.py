"""Reserved vs allocated over many training steps: traced step streams (memfit.trace.step_stream) replayed
through the caching allocator (memfit.trace.allocator), with steps of one length or of lengths that vary the
way a dataset's samples do.

    model = length_model(scenario)                       # 4 traced steps (3 fit, 1 checks)
    run = simulate(model, sample_lengths(200, 2048, seed=1), static_bytes=..., capacity=...)
    run.peak_reserved / run.peak_allocated

`static_bytes` stands for the model states a rank holds across steps (weights and optimizer shards, ...); the
caller takes them from the estimate (this checker module may not import it).
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, replace

from memfit.errors import MemfitError
from memfit.facts.scenario import Scenario
from memfit.trace.allocator import DEFAULT_RULES, Replay, Replayer, Rules, replay
from memfit.trace.step_stream import LengthModel, PhaseLoad, run_stream, trace_step

FIT_FRACTIONS = (4, 2, 1)  # lengths traced for the fit: max/4, max/2, max
CHECK_FRACTION = (3, 4)  # and the one that checks it: 3/4 of max
# sample lengths (tokens per row of a DPO pair: the longer of chosen and rejected, with the prompt): log-normal,
# median 600 and sigma 0.7 (about 3% of pairs reach 2048 and are cut there), like UltraFeedback-style sets
MEDIAN_TOKENS, SIGMA = 600, 0.7
MIN_TOKENS = 32


@dataclass(frozen=True)
class Spec:
    """One traced configuration of the study: by default OpenRLHF-style DPO under ZeRO-3 on 8 cards (a row of
    facts/data/allocator_slack.toml); with method "sft", profile "hf-trainer", gpus 1 and zero_stage None, an HF
    Trainer SFT run on one card (a row of facts/data/allocator_reserve.toml, trace/allocator_reserve.py)."""
    model: str
    attention: str
    max_len: int
    layers: int | None = None  # None: the model's own
    profile: str = "openrlhf"
    method: str = "dpo"
    gpu: str = "a100-80gb"
    gpus: int = 8
    zero_stage: int | None = 3  # None: no engine
    tuning: str | None = None  # None: the profile's default
    micro_batch: int = 1
    lora_rank: int | None = None  # None: the profile's default
    lora_targets: tuple[str, ...] | None = None
    padding: str | None = None  # None: the profile's default; "packed": every row max_len real tokens

    @property
    def key(self) -> str:
        layers = f"-{self.layers}layers" if self.layers else ""
        method = f"{self.method}-{self.tuning}" if self.tuning else self.method
        engine = f"zero{self.zero_stage}" if self.zero_stage is not None else f"{self.gpus}gpu"
        batch = f"/mb{self.micro_batch}" if self.micro_batch != 1 else ""
        return f"{self.model}{layers}/{method}/{engine}{batch}/{self.attention}/{self.max_len}"


def spec_scenario(spec: Spec):
    """The scenario a Spec names: checkpointing asked for (a remote-code file that ignores it leaves it off, as
    GLM-4's does: data/remote_code.toml), the Spec's knobs over its profile's defaults, on the Spec's cards."""
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    model = find_model(spec.model)
    if spec.layers:
        model = replace(model, num_layers=spec.layers)
    knobs = {"method": spec.method, "zero_stage": spec.zero_stage, "micro_batch": spec.micro_batch,
             "seq_len": spec.max_len, "checkpointing": "full", "attention": spec.attention, "tuning": spec.tuning,
             "lora_rank": spec.lora_rank, "lora_targets": spec.lora_targets, "padding": spec.padding}  # None: unsaid
    return build_scenario(model, Hardware(find_gpu(spec.gpu), gpus_per_node=spec.gpus), knobs, spec.profile)


def length_model(scenario: Scenario, max_len: int | None = None) -> LengthModel:
    """Trace the step at three lengths up to max_len (default: the scenario's) and check the fit at a fourth."""
    top = max_len or scenario.seq_len
    lengths = [top // f for f in FIT_FRACTIONS] + [top * CHECK_FRACTION[0] // CHECK_FRACTION[1]]
    return LengthModel.fit([trace_step(scenario, n) for n in lengths])


def sample_lengths(steps: int, max_len: int, seed: int, median: int = MEDIAN_TOKENS, sigma: float = SIGMA) -> list[int]:
    """Per-step sequence lengths of micro-batch 1: log-normal around `median`, cut at max_len."""
    rng = random.Random(seed)
    return [max(MIN_TOKENS, min(max_len, round(rng.lognormvariate(math.log(median), sigma)))) for _ in range(steps)]


def _steps(model: LengthModel, lengths: list[int]) -> list:
    cache: dict = {}
    for n in lengths:
        if n not in cache:
            cache[n] = model.step(n)
    return [cache[n] for n in lengths]


def simulate(model: LengthModel, lengths: list[int], static_bytes: int = 0, capacity: int | None = None,
             rules: Rules = DEFAULT_RULES) -> Replay:
    return replay(run_stream(_steps(model, lengths), static_bytes), capacity, rules)


def longest_fitting(model: LengthModel, history: list[int], static_bytes: int, capacity: int, top: int,
                    grain: int = 64, rules: Rules = DEFAULT_RULES) -> int:
    """The longest step (a multiple of `grain` up to `top`; 0: none) that still fits once `history` has run:
    the same card and model, before and after the cache has been shaped by other lengths. Binary search: a
    longer step is assumed to need at least what a shorter one does."""
    base = Replayer(capacity, rules)
    if base.feed(run_stream(_steps(model, history), static_bytes)) is not None:
        return 0
    lo, hi = 0, top // grain
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = copy.deepcopy(base)
        ok = trial.feed(run_stream([model.step(mid * grain)])) is None  # every history step freed its keys
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    return lo * grain


def reserve_share(phases: dict[str, PhaseLoad], reserved: int) -> float:
    """The least share f of each phase's churn for which the largest phase's allocated + f x churn reaches
    `reserved`: the factor memfit's reserved profile (memory/phases.py reserved_profile) needs to give it."""
    if reserved <= max(p.allocated for p in phases.values()):
        return 0.0
    return min((reserved - p.allocated) / p.churn for p in phases.values() if p.churn > 0)


def least_capacity(events, low: int, high: int, grain: int = 2 * 1024 * 1024, rules: Rules = DEFAULT_RULES) -> int:
    """The fewest device bytes (a multiple of `grain`, between `low`, the stream's allocated peak, and `high`, its
    reserved peak) the stream runs in without running out: short of room, the allocator frees its wholly free cached
    segments and retries (R8), so a run can fit in less than it reserves on a larger card. Binary search: more room
    is assumed never to make a run fail."""
    lo, hi = (low - 1) // grain, -(-high // grain)  # lo fails (below the allocated peak); hi fits (no limit)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if replay(events, mid * grain, rules).oom is None else (mid, hi)
    return hi * grain


@dataclass(frozen=True)
class Growth:
    """How reserved moves over a run: per-step levels summarised."""
    peak_allocated: int
    peak_reserved: int
    reserved_after: dict  # step index -> reserved at that step's end
    oom_step: int | None  # the step that ran out of memory (None: none did)
    releases: int  # R8 releases (cached segments freed to retry an allocation)

    @property
    def slack(self) -> float:
        """Peak reserved over peak allocated, minus 1."""
        return self.peak_reserved / self.peak_allocated - 1 if self.peak_allocated else 0.0


def growth(run: Replay, checkpoints=(0, 9, 49, 99, 199, 499)) -> Growth:
    after = {k: run.steps[k].reserved_end for k in checkpoints if k < len(run.steps)}
    oom = len(run.steps) if run.oom is not None else None
    return Growth(run.peak_allocated, run.peak_reserved, after, oom, run.releases)


def main(argv: list[str] | None = None) -> int:
    """python -m memfit.trace.allocator_study MODEL --attention eager --max-len 2048 [--steps --seeds --static-gib
    --capacity-gib]: per-rank reserved growth of an OpenRLHF DPO run under ZeRO-3 (the study in the issue)."""
    import argparse

    p = argparse.ArgumentParser(description="reserved vs allocated over steps of varying length")
    p.add_argument("model")
    p.add_argument("--attention", default="eager")
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--static-gib", type=float, default=0.0, help="model states per rank (from memfit estimate)")
    p.add_argument("--capacity-gib", type=float, default=None, help="device bytes torch may reserve")
    a = p.parse_args(argv)
    gib = 2**30
    try:
        model = length_model(spec_scenario(Spec(a.model, a.attention, a.max_len, a.layers)))
    except MemfitError as e:
        p.exit(2, f"memfit: error: {e}\n")
    cap = int(a.capacity_gib * gib) if a.capacity_gib else None
    runs = [("uniform", [a.max_len] * a.steps)] + [(f"seed {s}", sample_lengths(a.steps, a.max_len, seed=s))
                                                   for s in range(a.seeds)]
    for name, lengths in runs:
        g = growth(simulate(model, lengths, int(a.static_gib * gib), cap))
        after = ", ".join(f"{k + 1}: {v / gib:.1f}" for k, v in g.reserved_after.items())
        print(f"{name:8} allocated {g.peak_allocated / gib:6.2f} GiB  reserved {g.peak_reserved / gib:6.2f} GiB  "
              f"reserved after steps {{{after}}}  oom at step {g.oom_step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
