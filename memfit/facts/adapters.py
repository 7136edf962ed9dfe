"""PEFT methods besides LoRA: which Linears they adapt (data/adapters.toml) and what each adapted Linear adds
(data/peft.toml, derived from PEFT's own layers by memfit/trace/peft_facts.py).

A fact is a list of [size product, bytes per element] terms over T (tokens), I (in_features), O (out_features),
R (rank) and a method's own factor sizes (peft_shapes.py); `bytes_of` evaluates them with a Linear's real widths.
"""
from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

from memfit.facts.peft_shapes import fact_key

HERE = Path(__file__).resolve().parent / "data"


@cache
def _methods() -> dict:
    with open(HERE / "adapters.toml", "rb") as f:
        return tomllib.load(f)["method"]


@cache
def layer_facts() -> dict:
    with open(HERE / "peft.toml", "rb") as f:
        return tomllib.load(f)


def adapter_methods() -> tuple[str, ...]:
    return tuple(_methods())


def peft_methods() -> tuple[str, ...]:
    """The methods PEFT itself implements (a config class); the others run in a framework's own code."""
    return tuple(name for name, info in _methods().items() if "peft" in info)


def wraps(method: str) -> str | None:
    """How a method of adapters.toml attaches: "linear", "virtual_tokens", "norms" (None: not one of them)."""
    return _methods()[method]["wraps"] if method in _methods() else None


def trains_adapters(tuning: str) -> bool:
    """PEFT adapters on a frozen base: LoRA, QLoRA, or another method of data/adapters.toml."""
    return tuning in ("lora", "qlora") or tuning in adapter_methods()


def method_info(name: str) -> dict:
    return _methods()[name]


def setup_name(precision: str, autocast: bool, adapter_bytes: int) -> str:
    """The precision setup of peft.toml a run matches (the dtypes its adapted Linears see)."""
    if precision == "fp32":
        return "fp32"
    if autocast:
        return "autocast" if adapter_bytes == 4 else "autocast_16bit_adapters"
    return "16bit_fp32_adapters" if adapter_bytes == 4 else "16bit"


def facts_for(method: str, setup: str, feedforward: bool = False, sizes: dict[str, int] | None = None) -> dict:
    """The facts of one adapted Linear; `sizes` (peft_shapes.layer_sizes) picks a method's branch (LoKr)."""
    key = fact_key(method, sizes) if sizes else method
    key = f"{method}_feedforward" if feedforward and f"{method}_feedforward" in layer_facts() else key
    return layer_facts()[key][setup]


def _product(term: str, sizes: dict[str, int]) -> int:
    value = 1
    for factor in term.split("*"):
        value *= sizes[factor] if factor in sizes else int(factor)
    return value


def elements_of(terms: list, sizes: dict[str, int]) -> int:
    return sum(_product(term, sizes) for term, _ in terms)


def bytes_of(terms: list, sizes: dict[str, int], per_token: bool) -> int:
    """Bytes of the terms that grow with the tokens (per token), or of those that do not."""
    chosen = [(t, b) for t, b in terms if ("T" in t.split("*")) == per_token]
    return sum(_product(t, {**sizes, "T": 1}) * b for t, b in chosen)
