"""Derive what each transformers activation function keeps for backward, by running it.

    python -m memfit.trace.activation_facts            # rewrite memfit/facts/data/activations.toml
    python -m memfit.trace.activation_facts --check    # exit 1 when the installed transformers disagrees

An MLP's activation saves a number of tensors as wide as its input (F.gelu saves its input: 1;
transformers' NewGELUActivation is a Python formula whose multiplies and tanh each keep one: 4). That count,
in bytes of the compute dtype per element, is the fact the analytic model needs (memory/activations.py);
it is measured here on bf16 tensors with saved-tensor hooks, so it holds for the transformers version
written beside it. Measured twice: plainly, and under autocast with CUDA's op lists (memfit/trace/autocast.py),
where a formula's pow and exp run in fp32 and promote what follows (gelu_new: 4 units plain, 7 under autocast).
"""
from __future__ import annotations

import sys
from pathlib import Path

from contextlib import ExitStack

import torch

from memfit.trace.autocast import CudaAutocastPolicy
from memfit.trace.fact_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "facts" / "data" / "activations.toml"
WIDTH = 4099  # prime: no other tensor of the step has this many elements


def saved_units(name: str, autocast: bool = False) -> tuple[float, bool, bool]:
    """(input-sized tensors the activation saves, in bf16 units: an fp32 copy counts 2; whether one of them is
    its output, which is also the next Linear's input and so not an extra tensor when that Linear trains; whether
    the output is fp32), run plainly or under bf16 autocast with CUDA's op lists."""
    from transformers.activations import ACT2FN

    act = ACT2FN[name]
    x = torch.randn(3, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(t):
        if t.numel() == x.numel():
            saved.append(t)
        return t

    with ExitStack() as stack:
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        if autocast:
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            stack.enter_context(CudaAutocastPolicy())
        y = act(x * 1)  # x * 1: the leaf itself is never what the activation sees
    # one tensor saved by two ops (ReLU-squared: relu keeps its output, square keeps its input, the same tensor)
    # is one tensor of memory
    unique = {t.untyped_storage().data_ptr(): t for t in saved}.values()
    units = sum(t.element_size() for t in unique) / 2
    return units, any(t.data_ptr() == y.data_ptr() for t in unique), y.dtype == torch.float32


def derive() -> dict[str, tuple[tuple, tuple]]:
    """name -> (plain reading, autocast reading) of saved_units."""
    from transformers.activations import ACT2FN

    out = {}
    for name in sorted(ACT2FN):
        try:
            out[name] = saved_units(name), saved_units(name, autocast=True)
        except Exception:  # activations needing a GPU kernel or extra packages are not derivable here
            continue
    return out


def render(facts: dict[str, tuple[tuple, tuple]]) -> str:
    import transformers

    lines = ["# Input-sized tensors each transformers activation (ACT2FN name) saves for backward, in units of the",
             "# compute dtype's bytes (bf16 = 1 per element). Written by `python -m memfit.trace.activation_facts`",
             "# (saved-tensor hooks on bf16 tensors, plainly and under autocast with CUDA's op lists); do not edit.",
             f'transformers = "{transformers.__version__}"', f'torch = "{torch.__version__.split("+")[0]}"', "",
             "[saved]"]
    lines += [f'"{name}" = {plain[0]:g}' for name, (plain, _) in facts.items()]
    lines += ["", "# activations whose saved tensors include their own output (ReLU): the next Linear's input", "[saves_output]"]
    lines += [f'"{name}" = true' for name, (plain, _) in facts.items() if plain[1]]
    lines += ["", "# the same under bf16 autocast with CUDA's op lists", "[saved_autocast]"]
    lines += [f'"{name}" = {auto[0]:g}' for name, (_, auto) in facts.items()]
    lines += ["", "[saves_output_autocast]"]
    lines += [f'"{name}" = true' for name, (_, auto) in facts.items() if auto[1]]
    lines += ["", "# activations whose output is fp32 under autocast (pow / exp promote the formula): the next Linear",
              "# reads fp32", "[fp32_output_autocast]"]
    lines += [f'"{name}" = true' for name, (_, auto) in facts.items() if auto[2]]
    return "\n".join(lines) + "\n"


def derived_text() -> str:
    return render(derive())


def main(argv: list[str] | None = None) -> int:
    return write_or_check(__doc__.splitlines()[0], OUT, derived_text, "transformers", argv)


if __name__ == "__main__":
    sys.exit(main())
