"""How far a real run's device total may exceed memfit's estimate, per kind of run, and the chance that it runs
out of memory at a given margin (data/error_bands.toml, written by bench/error_bands.py from the benches).

A kind is FAMILY/TUNING, judged on the device total: the engine family (single, ddp, zero0-2, zero3, fsdp) and
what trains (full; adapters: LoRA and the other PEFT methods on an unquantized base; qlora: adapters on a
quantized base; freeze). Each kind has two bands and a verdict needs the larger: the CPU benches' (a share of the
estimate: what the trace and engine rows measured plus an allowance for what they cannot see) and the real GPU
runs' (a floor plus a share, set on half the real runs and checked on the other half). A kind the benches have
not measured (and any run with a vLLM generator) gets the widest band of each and says so: a guess errs toward
more memory.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from functools import cache

from memfit.facts.catalog import HERE
from memfit.facts.methods import method_facts

TABLE = HERE / "error_bands.toml"


def family_of(engine: str, zero_stage: int | None) -> str:
    """The engine family a band is kept for: DeepSpeed splits at ZeRO-3, which gathers every layer's weights."""
    if engine == "deepspeed":
        return "zero3" if zero_stage == 3 else "zero0-2"
    return engine


def tuning_group(tuning: str, adapters: bool, quantized_base: bool) -> str:
    if tuning == "qlora" or (adapters and quantized_base):
        return "qlora"
    return "adapters" if adapters else tuning


def kind_of(s) -> str:
    kind = f"{family_of(s.engine, s.zero_stage)}/" \
           f"{tuning_group(s.tuning, s.uses_adapters, s.model.quantization is not None)}"
    # a vLLM generator's own pool (KV cache, CUDA graphs) is in neither bench
    return kind + "+vllm" if method_facts(s.method).get("generator") else kind


@dataclass(frozen=True)
class Band:
    kind: str  # the kind asked for
    fraction: float  # measured + allowance: the share of the estimated device total a real run may add
    measured: float  # what the benches found (an upper quantile of their under-predictions)
    allowance: float  # what no CPU bench can see, assumed (data/error_allowances.toml)
    under: tuple[float, ...]  # each bench row's under-prediction (real / estimate - 1), the engine part added
    stands_in_for: str = ""  # the measured kind whose band an unmeasured kind borrows ("" when measured)
    floor: int = 0  # the real runs' band: floor bytes + real_fraction x the estimate
    real_fraction: float = 0.0
    real_rows: int = 0  # real runs of this kind (0: none)
    real: tuple[float, ...] = ()  # their excess over the estimate, as shares of it (the widest kind's if too few)
    real_stands_in: str = ""  # the real kind whose band this one takes ("" when its own runs set it)

    def required(self, peak: int) -> int:
        """The margin a run with this estimated device total needs for "fits": the larger band."""
        return max(math.ceil(self.fraction * peak), self.floor + math.ceil(self.real_fraction * peak))

    def fraction_at(self, peak: int) -> float:
        """The band as a share of this estimate (what a verdict on it needs, over the estimate)."""
        return self.required(peak) / peak if peak > 0 else self.fraction

    def oom_chance(self, margin: int, peak: int) -> float:
        """The share of the kind's bench rows whose error would eat the margin, the unmeasured part taken as
        anywhere between nothing and its allowance, each equally likely.

        With m = margin / estimated device total, a row with under-prediction u runs out of memory when
        u + a > m, a ~ uniform(0, allowance): probability clip((u + allowance - m) / allowance, 0, 1). The
        chance is the mean over the rows: it falls as the margin grows, is 1 once the margin is below every
        row's error, and is at most the share of rows above the measured quantile when the margin clears the band.
        """
        m = margin / peak if peak > 0 else float("inf")
        if self.real:  # real runs see everything a GPU holds: their share beyond the margin
            return sum(r > m for r in self.real) / len(self.real)
        if not self.under:
            return 1.0
        if self.allowance <= 0:
            return sum(u > m for u in self.under) / len(self.under)
        return sum(min(1.0, max(0.0, (u + self.allowance - m) / self.allowance)) for u in self.under) / len(self.under)

    def describe(self, peak: int) -> str:
        """The band as the estimate lists it under "assumed"."""
        text = (f"error band {self.fraction_at(peak):.1%} of the device total for {self.kind} runs, the larger of: "
                f"real GPU runs {self.floor / 2**30:.2f} GiB + {self.real_fraction:.1%} ("
                + (f"{self.real_rows} real runs of this kind" if not self.real_stands_in else
                   f"{self.real_rows} real runs of this kind, too few: the widest measured of its tuning, "
                   f"{self.real_stands_in}'s")
                + f"; data/error_bands.toml), and the CPU benches {self.fraction:.1%} ({self.measured:.1%} measured + "
                  f"{self.allowance:.1%} allowed for what they cannot see: fragmentation, NCCL, library workspaces; "
                  f"data/error_allowances.toml)")
        if self.stands_in_for:
            text += (f"; {self.kind} is not measured by the CPU benches, so their widest band ({self.stands_in_for}) "
                     f"stands in for it")
        return text


@cache
def table() -> dict:
    with open(TABLE, "rb") as f:
        return tomllib.load(f)


@cache
def measured_band(kind: str) -> Band | None:
    row = table()["band"].get(kind)
    if row is None:
        return None
    trace = table()["trace"][row["trace"]]["under"]
    return Band(kind, row["band"], row["measured"], row["allowance"],
                tuple(u + row["engine"] for u in trace))


@cache
def widest() -> Band:
    bands = [b for k in table()["band"] if (b := measured_band(k)) is not None]  # every row's kind is measured
    return max(bands, key=lambda b: (b.fraction, b.kind))


@cache
def band_for(kind: str) -> Band:
    found = measured_band(kind)
    if found is None:
        wide = widest()
        found = Band(kind, wide.fraction, wide.measured, wide.allowance, wide.under, stands_in_for=wide.kind)
    return replace(found, **real_band(kind))


def real_band(kind: str) -> dict:
    """The real runs' band of a kind: its own when it has enough real runs, else the widest measured of its tuning
    (the widest of all when its tuning has none), with that kind's runs' shares for the chance of OOM."""
    real = table().get("real", {})
    row = real.get(kind)
    wide = table().get("real_widest")
    if wide is None:
        return {}
    if row is None or row["stands_in"]:
        tuning = kind.split("/", 1)[-1]
        source = row["stands_in"] if row else table().get("real_widest_of", {}).get(tuning, wide["kind"])
        src = real[source]
        return {"floor": int(src["floor_gib"] * 2**30), "real_fraction": src["fraction"],
                "real_rows": row["rows"] if row else 0, "real": tuple(src.get("relative", ())),
                "real_stands_in": source}
    return {"floor": int(row["floor_gib"] * 2**30), "real_fraction": row["fraction"], "real_rows": row["rows"],
            "real": tuple(row["relative"])}


def band_of(s) -> Band:
    return band_for(kind_of(s))
