"""`memfit calibrate`: the runtime constants a monitored run shows, measured against memfit's own estimate of it.

Each constant is what the run held beyond the part of the estimate that does not depend on that constant:
  process_host_baseline   a rank's host RSS between steps, minus the host bytes the estimate explains besides
                          the baseline (offloaded states, pinned buffers) and, on a CPU run, the model states
                          the estimate places on the device (there, the device is host memory)
  cuda_context / nccl_*   a CUDA rank's device bytes used outside torch's allocator (device used - reserved):
                          the CUDA context on one GPU, context + NCCL on several
  fragmentation_of_churn  reserved - peak allocated, as a share of the bytes the estimate frees within a step
The estimate is made with the default constants; a constant the run cannot show (no CUDA: context, NCCL and
allocator slack) keeps its value. Medians over the steady steps (after the first) keep one odd step out.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from memfit.errors import MemfitError
from memfit.facts.runtime import Runtime

STEADY_PHASE = "checkpoint_save"  # between steps: weights and optimizer states, no activations or gradients
GIB = 2**30


@dataclass
class Calibration:
    values: dict[str, int | float] = field(default_factory=dict)  # runtime constant -> measured value
    evidence: dict[str, str] = field(default_factory=dict)  # constant -> how it was measured, in numbers
    ranks: int = 0
    steps: int = 0
    device_kind: str = ""


def _steady(samples: list) -> list:
    """The samples after the first step (load and the first step's one-time allocations are behind them)."""
    return samples[1:] if len(samples) > 1 else samples


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def calibrate(by_rank: dict[int, list], e, runtime: Runtime) -> Calibration:
    """`by_rank`: the run's samples (memfit/interfaces/runs/read.py); `e`: memfit's estimate of that run made
    with `runtime`, the constants the run's numbers are compared against."""
    if not by_rank or not any(by_rank.values()):
        raise MemfitError("the run has no samples: nothing to calibrate from")
    kinds = {s.device_kind for samples in by_rank.values() for s in samples}
    if len(kinds) != 1:
        raise MemfitError(f"the runs mix device kinds {sorted(map(str, kinds))}: calibrate one machine at a time")
    out = Calibration(ranks=len(by_rank), steps=max(len(v) for v in by_rank.values()), device_kind=kinds.pop() or "")
    _host_baseline(out, by_rank, e, runtime)
    if out.device_kind == "cuda":
        _non_torch(out, by_rank, e, runtime)
        _fragmentation(out, by_rank, e, runtime)
    return out


def cpu_run_rss(e, phase: str | None = None) -> int:
    """A CPU run's process RSS per rank as the estimate places it: the rank's host bytes (its baseline included)
    and the bytes the estimate puts on the device, which on a CPU run is host memory too. `phase` None: the step's
    peak (what a monitor's per-step RSS high-water mark measures)."""
    device = e.allocated.peak if phase is None else e.allocated.phases[phase]
    host = e.host.phases[STEADY_PHASE].total / e.scenario.hardware.gpus_per_node
    return int(host + device.total - device.get("runtime_overhead"))  # the cuBLAS workspace exists only on CUDA


def _host_baseline(out: Calibration, by_rank: dict, e, runtime: Runtime) -> None:
    rss = _median([_median([s.host_rss for s in _steady(v)]) for v in by_rank.values()])
    if rss is None:
        return
    host_other = e.host.phases[STEADY_PHASE].total / e.scenario.hardware.gpus_per_node - runtime.process_host_baseline
    device = 0
    if out.device_kind == "cpu":
        device = cpu_run_rss(e, STEADY_PHASE) - runtime.process_host_baseline - host_other
    baseline = int(rss - host_other - device)
    if baseline <= 0:
        raise MemfitError(f"the run's host RSS ({rss / GIB:.2f} GiB per rank) is below what the estimate places in "
                          f"host memory ({(host_other + device) / GIB:.2f} GiB): the run is not the one described; "
                          "check the model and knobs given to calibrate")
    out.values["process_host_baseline"] = baseline
    out.evidence["process_host_baseline"] = (
        f"host RSS {rss / GIB:.3f} GiB per rank (median of {out.ranks} ranks' steady steps) - "
        f"{host_other / GIB:.3f} GiB the estimate places in host memory besides the baseline"
        + (f" - {device / GIB:.3f} GiB of model states on the CPU device" if device else ""))


def _non_torch(out: Calibration, by_rank: dict, e, runtime: Runtime) -> None:
    used = _median([_median([None if s.device_used is None or s.reserved is None else s.device_used - s.reserved
                             for s in _steady(v)]) for v in by_rank.values()])
    if used is None:
        return
    hw = e.scenario.hardware
    if hw.world_size == 1:
        out.values["cuda_context"] = int(used)
        out.evidence["cuda_context"] = f"device used - reserved {used / GIB:.3f} GiB on one GPU: the CUDA context"
        return
    name = "nccl_multi_node" if hw.nodes > 1 else "nccl_one_node"
    out.values[name] = max(0, int(used - runtime.cuda_context))
    out.evidence[name] = (f"device used - reserved {used / GIB:.3f} GiB per GPU - CUDA context "
                          f"{runtime.cuda_context / GIB:.3f} GiB ({runtime.source})")


def _fragmentation(out: Calibration, by_rank: dict, e, runtime: Runtime) -> None:
    slack = _median([_median([None if s.reserved is None or s.peak_allocated is None
                              else max(0, s.reserved - s.peak_allocated) for s in _steady(v)])
                     for v in by_rank.values()])
    peak = max(e.reserved.phases, key=lambda phase: e.reserved.phases[phase].total)  # reserved is a high-water mark
    estimated = e.reserved.phases[peak].total - e.allocated.phases[peak].total
    share = runtime.slack_share(e.scenario.tuning)  # the share the estimate used (reserved_profile)
    if slack is None or estimated <= 0 or share <= 0:
        return
    churn = estimated / share
    out.values["fragmentation_of_churn"] = round(min(1.0, slack / churn), 4)
    out.evidence["fragmentation_of_churn"] = (f"reserved - peak allocated {slack / GIB:.3f} GiB over the "
                                              f"{churn / GIB:.3f} GiB the estimate frees within a step")
