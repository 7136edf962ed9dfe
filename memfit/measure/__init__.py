"""`memfit measure`: real steps of the real engine (DeepSpeed ZeRO-0..3, DDP, FSDP2, single), memory by category.

On a machine without CUDA the ranks run on the CPU with gloo; every tensor is then in RAM, and what would
sit on the GPU is told apart from what DeepSpeed offloads to the host by the engine's own objects
(see tracker.py and FINDINGS.md). Importing this package does not import torch; running it does.
"""
from __future__ import annotations

from memfit.measure.result import MeasureResult, NamedBuffer, RankMeasurement

__all__ = ["MeasureResult", "NamedBuffer", "RankMeasurement", "plan", "render", "run_batch", "run_measure"]


def run_measure(scenario, steps: int = 3, model_dir: str | None = None, **kwargs) -> MeasureResult:
    from memfit.measure.launch import run_measure as _run

    if scenario.releases:  # the engines run here are the installed releases, not the ones the estimate models
        from memfit.errors import MemfitError

        raise MemfitError("measure runs the installed (pinned) framework releases; drop --framework-version")

    return _run(scenario, steps, model_dir, **kwargs)


def run_batch(scenarios, steps: int = 3, model_dir: str | None = None, **kwargs) -> list[MeasureResult]:
    from memfit.measure.launch import run_batch as _run

    return _run(scenarios, steps, model_dir, **kwargs)


def plan(scenario, allow_substitutions: bool = True):
    from memfit.measure.launch import plan as _plan

    return _plan(scenario, allow_substitutions)


def render(result: MeasureResult, console) -> None:
    from memfit.measure.render import render as _render

    _render(result, console)
