"""activations.toml: what each MLP activation function keeps for backward (counted from the real torch ops)."""
from __future__ import annotations

from memfit.facts.data_table import data_table


def _activations() -> dict:
    return data_table("activations.toml")


def activation_saved(name: str, autocast: bool = False) -> float:
    """Input-sized tensors (in compute-dtype units) the MLP activation `name` keeps for backward, plainly or under
    16-bit autocast (CUDA's lists run a formula's pow in fp32); an unknown activation is given the largest count of
    any known one (guess high)."""
    saved = _activations()["saved_autocast" if autocast else "saved"]
    return saved.get(name, max(saved.values()))


def activation_saves_output(name: str, autocast: bool = False) -> bool:
    """Whether what the activation saves includes its own output (ReLU), the same tensor the next Linear saves."""
    return _activations().get("saves_output_autocast" if autocast else "saves_output", {}).get(name, False)


def activation_fp32_output(name: str, autocast: bool) -> bool:
    """Whether the activation's output is fp32 (under autocast a formula with pow promotes; unknown: no)."""
    return autocast and _activations().get("fp32_output_autocast", {}).get(name, False)


def known_activation(name: str) -> bool:
    return name in _activations()["saved"]
