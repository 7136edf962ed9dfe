"""Derive what each transformers activation function keeps for backward, by running it.

    python -m memfit.trace.activation_facts            # rewrite memfit/facts/data/activations.toml
    python -m memfit.trace.activation_facts --check    # exit 1 when the installed transformers disagrees

An MLP's activation saves a number of tensors as wide as its input (F.gelu saves its input: 1;
transformers' NewGELUActivation is a Python formula whose multiplies and tanh each keep one: 4). That count,
in bytes of the compute dtype per element, is the fact the analytic model needs (memory/activations.py);
it is measured here on bf16 tensors with saved-tensor hooks, so it holds for the transformers version
written beside it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from memfit.trace.fact_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "facts" / "data" / "activations.toml"
WIDTH = 4099  # prime: no other tensor of the step has this many elements


def saved_units(name: str) -> tuple[float, bool]:
    """(input-sized tensors the activation saves, in bf16 units: an fp32 copy counts 2; whether one of them is
    its output, which is also the next Linear's input and so not an extra tensor when that Linear trains)."""
    from transformers.activations import ACT2FN

    act = ACT2FN[name]
    x = torch.randn(3, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(t):
        if t.numel() == x.numel():
            saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = act(x * 1)  # x * 1: the leaf itself is never what the activation sees
    # one tensor saved by two ops (ReLU-squared: relu keeps its output, square keeps its input, the same tensor)
    # is one tensor of memory
    unique = {t.untyped_storage().data_ptr(): t for t in saved}.values()
    units = sum(t.element_size() for t in unique) / 2
    return units, any(t.data_ptr() == y.data_ptr() for t in unique)


def derive() -> dict[str, tuple[float, bool]]:
    from transformers.activations import ACT2FN

    out = {}
    for name in sorted(ACT2FN):
        try:
            out[name] = saved_units(name)
        except Exception:  # activations needing a GPU kernel or extra packages are not derivable here
            continue
    return out


def render(facts: dict[str, tuple[float, bool]]) -> str:
    import transformers

    lines = ["# Input-sized tensors each transformers activation (ACT2FN name) saves for backward, in units of the",
             "# compute dtype's bytes (bf16 = 1 per element). Written by `python -m memfit.trace.activation_facts`",
             "# (saved-tensor hooks on bf16 tensors); do not edit by hand.",
             f'transformers = "{transformers.__version__}"', "", "[saved]"]
    lines += [f'"{name}" = {units:g}' for name, (units, _) in facts.items()]
    lines += ["", "# activations whose saved tensors include their own output (ReLU): the next Linear's input", "[saves_output]"]
    lines += [f'"{name}" = true' for name, (_, output) in facts.items() if output]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(__doc__.splitlines()[0], OUT, lambda: render(derive()), "transformers", argv)


if __name__ == "__main__":
    sys.exit(main())
