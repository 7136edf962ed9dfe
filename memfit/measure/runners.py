"""The runner for a scenario: DeepSpeed, DDP, FSDP2 or one GPU; OpenRLHF's DPO (a policy and a reference engine)
for dpo / ipo."""
from __future__ import annotations

from memfit.errors import MemfitError
from memfit.facts.methods import OPENRLHF_DPO_METHODS
from memfit.facts.scenario import Scenario
from memfit.measure.deepspeed_runner import DeepSpeedRunner
from memfit.measure.dpo import DpoRunner
from memfit.measure.runner import Runner
from memfit.measure.torch_runners import DdpRunner, FsdpRunner, TorchRunner
from memfit.measure.tracker import MemoryTracker

RUNNERS = {"deepspeed": DeepSpeedRunner, "ddp": DdpRunner, "fsdp": FsdpRunner, "single": TorchRunner}


def runner_for(scenario: Scenario, tracker: MemoryTracker, model_dir: str | None = None, device: str = "cpu") -> Runner:
    if scenario.engine not in RUNNERS:
        raise MemfitError(f"memfit measure cannot run engine {scenario.engine!r}")
    if scenario.method in OPENRLHF_DPO_METHODS:  # OpenRLHF's policy + reference engines
        return DpoRunner(scenario, tracker, model_dir, device)
    return RUNNERS[scenario.engine](scenario, tracker, model_dir, device)
