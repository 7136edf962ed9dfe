"""Derive what each PEFT method adds to one adapted Linear, by running PEFT's own layer.

    python -m memfit.trace.peft_facts            # rewrite memfit/facts/data/peft.toml
    python -m memfit.trace.peft_facts --check    # exit 1 when the installed PEFT / torch disagree

One `nn.Linear(in, out)` is wrapped by each method and run forward on a `[1, tokens, in]` input that
requires grad, under each precision setup memfit models. Every size is a distinct prime, so the element count of each tensor the forward saves for backward factors
into a product of named sizes: `T*I` is a per-token copy of the input, `I*O` a weight-sized delta. The
facts written are those products with their bytes per element, for the saved tensors (minus the layer's
weights and the input itself, which the model counts once per group of Linears reading it) and for the
trainable and frozen tensors the method adds. memory/activations.py and memory/inventory.py evaluate them
with the real widths, so a new model needs no new rule, and a PEFT release that changes a layer fails
`--check`.
"""
from __future__ import annotations

import sys
from itertools import product
from pathlib import Path

import torch

from memfit.trace.fact_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "facts" / "data" / "peft.toml"
SIZES = {"T": 29, "I": 11, "O": 13, "R": 7}  # tokens, in_features, out_features, rank
# (name, autocast, frozen dtype, adapter dtype): the precision setups memfit tells apart (Scenario.runs_autocast,
# compute_bytes, adapter_bytes)
SETUPS = (("autocast", True, torch.bfloat16, torch.float32),
          ("autocast_16bit_adapters", True, torch.bfloat16, torch.bfloat16),
          ("16bit_fp32_adapters", False, torch.bfloat16, torch.float32),
          ("16bit", False, torch.bfloat16, torch.bfloat16),
          ("fp32", False, torch.float32, torch.float32))


def _configs(sizes: dict) -> dict:
    """PEFT configs of each method for a module named `proj` (the defaults PEFT itself uses otherwise)."""
    import peft

    r = sizes["R"]
    return {
        "ia3": peft.IA3Config(target_modules=["proj"], feedforward_modules=[]),
        "ia3_feedforward": peft.IA3Config(target_modules=["proj"], feedforward_modules=["proj"]),
        "vera": peft.VeraConfig(r=r, target_modules=["proj"]),
        "adalora": peft.AdaLoraConfig(init_r=r, target_r=max(1, r // 2), total_step=10, target_modules=["proj"]),
        "loha": peft.LoHaConfig(r=r, target_modules=["proj"]),
    }


class _One(torch.nn.Module):
    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.proj = torch.nn.Linear(fan_in, fan_out, bias=False)

    def forward(self, x):
        return self.proj(x)


def monomial(count: int, sizes: dict) -> str:
    """`count` as a product of the named sizes, e.g. 29 * 11 -> "T*I"; a leftover factor is kept as a number."""
    symbols = list(sizes)
    for powers in product(range(4), repeat=len(symbols)):
        value = 1
        for s, p in zip(symbols, powers):
            value *= sizes[s] ** p
        if count % value == 0 and all(count // value % sizes[s] for s in symbols):
            names = [s for s, p in zip(symbols, powers) for _ in range(p)]
            rest = count // value
            return "*".join(([str(rest)] if rest != 1 else []) + names) or "1"
    raise ValueError(f"{count} is not a product of {sizes}")


def _wrapped(method: str, sizes: dict, frozen, adapter):
    import peft

    model = peft.get_peft_model(_One(sizes["I"], sizes["O"]), _configs(sizes)[method])
    for p in model.parameters():
        p.data = p.data.to(adapter if p.requires_grad else frozen)
    for b in model.buffers():  # VeRA's shared projections: a module cast (DeepSpeed) casts them with the adapters
        if b.is_floating_point():
            b.data = b.data.to(adapter)
    return model


def _tensor_terms(tensors, sizes: dict) -> list[tuple[str, int]]:
    """(monomial, bytes per element) of each distinct storage."""
    seen, out = set(), []
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or t.dtype == torch.bool and t.numel() == 1:
            continue
        seen.add(storage.data_ptr())
        out.append((monomial(storage.nbytes() // t.element_size(), sizes), t.element_size()))
    return out


def layer_facts(method: str, autocast: bool, frozen, adapter) -> dict:
    """What one adapted Linear holds: trainable and frozen tensors the method adds, saved tensors of a forward."""
    sizes = SIZES
    torch.manual_seed(0)
    with torch.no_grad():
        model = _wrapped(method, sizes, frozen, adapter)
    base = model.base_model.model.proj.base_layer.weight
    x = torch.randn(1, sizes["T"], sizes["I"], dtype=frozen, requires_grad=True)
    x_in = x * 1  # a non-leaf input, as a layer's Linears see
    held = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(x_in)
    reads_input = any(t.untyped_storage().data_ptr() == x_in.untyped_storage().data_ptr() for t in saved)
    extra = [t for t in saved if t.untyped_storage().data_ptr() not in held | {x_in.untyped_storage().data_ptr()}]
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen_extra = [p for p in model.parameters() if not p.requires_grad and p is not base]
    frozen_extra += [b for b in model.buffers() if b.numel() > 1]
    return {"trainable": _tensor_terms(trainable, sizes), "frozen": _tensor_terms(frozen_extra, sizes),
            "saved": _tensor_terms(extra, sizes), "saves_input": reads_input}


WIDE = {"T": 16, "I": 1024, "O": 2048, "R": 8}  # few tokens: what backward adds beyond them is weight-sized


def backward_weight_copies(method: str, autocast: bool, frozen, adapter) -> float:
    """Weight-sized tensors (I x O in the adapters' dtype) alive at once in one adapted Linear's backward
    beyond what its forward left (LoHa's HadaWeight.backward: 4), to the nearest half; counted with the
    trace's allocator model (memfit/trace/accountant.py)."""
    from memfit.trace.accountant import Accountant

    model = _wrapped(method, WIDE, frozen, adapter)
    x = torch.randn(1, WIDE["T"], WIDE["I"], dtype=frozen, requires_grad=True)
    acc = Accountant()
    with acc:
        acc.enter_phase("forward", 0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x * 1).float().sum()
        after_forward = acc.live_bytes
        acc.enter_phase("backward", 0)
        loss.backward()
    weight = WIDE["I"] * WIDE["O"] * torch.finfo(adapter).bits // 8
    return round(2 * (acc.peaks["0:backward"].total - after_forward) / weight) / 2


def derive() -> dict:
    facts = {}
    for method in _configs(SIZES):
        facts[method] = {}
        for name, autocast, frozen, adapter in SETUPS:
            facts[method][name] = layer_facts(method, autocast, frozen, adapter)
            facts[method][name]["backward_weights"] = backward_weight_copies(method, autocast, frozen, adapter)
    return facts


def _terms(terms) -> str:
    return "[" + ", ".join(f'["{m}", {b}]' for m, b in terms) + "]"


def render(facts: dict) -> str:
    import peft

    lines = ["# What each PEFT method adds to one adapted Linear (T tokens, I in_features, O out_features, R rank).",
             "# Each term is [size product, bytes per element]. Written by",
             "# `python -m memfit.trace.peft_facts` (PEFT's own layers run on CPU tensors); do not edit by hand.",
             "#   trainable / frozen  tensors the method adds (frozen: VeRA's shared projections, AdaLoRA's rank)",
             "#   saved               what a forward keeps for backward beyond the weights and the input itself",
             "#   saves_input         a saved tensor is the layer's input (shared with the other Linears reading it)",
             "#   backward_weights    weight-sized (I*O, adapter dtype) temporaries of the layer's backward",
             f'peft = "{peft.__version__}"', f'torch = "{torch.__version__}"', ""]
    for method, setups in facts.items():
        for setup, f in setups.items():
            lines += [f"[{method}.{setup}]", f"trainable = {_terms(f['trainable'])}", f"frozen = {_terms(f['frozen'])}",
                      f"saved = {_terms(f['saved'])}", f"saves_input = {str(f['saves_input']).lower()}",
                      f"backward_weights = {f['backward_weights']:g}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(__doc__.splitlines()[0], OUT, lambda: render(derive()), "PEFT", argv)


if __name__ == "__main__":
    sys.exit(main())
