"""A run's speed as memfit states it: the step time and tokens/s of the step-time model with the band measured
rows land in (speed.toml [band], measured by tools/calibrate_speed.py), and given the data's size, the wall-clock
and cost of the whole run.

`predict(scenario) -> (step_s, tokens_per_s, band)` is the one entry point other code (bench/cuda_truth.py) calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.facts.scenario import Scenario
from memfit.planner.speed_constants import assumptions
from memfit.planner.step_time import step_time


@dataclass(frozen=True)
class Band:
    """Measured tokens/s lands in [low, high] x the prediction for `coverage` of the measured rows."""

    low: float
    high: float
    coverage: float

    def to_json(self) -> dict:
        return {"low": round(self.low, 3), "high": round(self.high, 3), "coverage": self.coverage}


def band() -> Band:
    b = assumptions()["band"]
    return Band(b["low"], b["high"], b["coverage"])


def tie_band() -> float:
    """Two configurations of one job whose predicted speeds differ by less than this share are a tie."""
    return assumptions()["band"]["tie"]


def ties(a: float, b: float) -> bool:
    """Predicted tokens/s a and b are too close for the model to say which is faster."""
    return min(a, b) >= max(a, b) * (1 - tie_band())


def predict(s: Scenario) -> tuple[float, float, Band]:
    """(seconds per optimizer step, tokens per second of the whole job, the band measured rows land in)."""
    st = step_time(s)
    return st.seconds, st.tokens_per_second, band()


@dataclass(frozen=True)
class RunCost:
    """The whole run: `tokens` real tokens at the predicted rate, on `gpus` GPUs."""

    tokens: int
    seconds: float
    gpus: int
    price_per_gpu_hour: float | None

    @property
    def gpu_hours(self) -> float:
        return self.seconds / 3600 * self.gpus

    @property
    def cost(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def to_json(self, b: Band) -> dict:
        # slower measured speed (low) means a longer run: the band's ends swap
        out = {"tokens": self.tokens, "seconds": round(self.seconds, 1),
               "seconds_band": [round(self.seconds / b.high, 1), round(self.seconds / b.low, 1)],
               "gpu_hours": round(self.gpu_hours, 2)}
        cost = self.cost
        if cost is not None:  # a price per GPU-hour was given
            out |= {"price_per_gpu_hour": self.price_per_gpu_hour, "cost": round(cost, 2),
                    "cost_band": [round(cost / b.high, 2), round(cost / b.low, 2)]}
        return out


def run_cost(s: Scenario, tokens: int, price_per_gpu_hour: float | None = None) -> RunCost:
    _, tokens_per_s, _ = predict(s)
    seconds = tokens / tokens_per_s if tokens_per_s > 0 else float("inf")
    return RunCost(tokens, seconds, s.world_size, price_per_gpu_hour)


def speed_json(s: Scenario, run: RunCost | None = None) -> dict:
    """The estimate's "speed" section: {"tokens_per_s", "step_s", "band"} (and "run" given the data's size)."""
    step_s, tokens_per_s, b = predict(s)
    out = {"tokens_per_s": round(tokens_per_s, 1), "step_s": round(step_s, 4), "band": b.to_json()}
    if run is not None:
        out["run"] = run.to_json(b)
    return out
