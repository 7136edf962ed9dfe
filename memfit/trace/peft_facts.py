"""Derive what each PEFT method adds to one adapted Linear, by running PEFT's own layer.

    python -m memfit.trace.peft_facts            # rewrite memfit/facts/data/peft.toml
    python -m memfit.trace.peft_facts --check    # exit 1 when the installed PEFT / torch disagree

One `nn.Linear(in, out)` is wrapped by each method and run forward on a `[1, tokens, in]` input that
requires grad, under each precision setup memfit models. Every size is a distinct prime (or a named product of
them: LoKr's Kronecker factors I = I1*I2, OFT's K blocks of B, I = K*B), so the element count of each
tensor the forward saves for backward factors into a product of named sizes: `T*I` is a per-token copy of the
input, `I*O` a weight-sized delta. Each method is derived twice, with two sets of sizes: a term that is not a
product of named sizes (B-1, a rounded count) reads differently in the two and the derivation fails. The
facts written are those products with their bytes per element, for the saved tensors (minus the layer's
weights and the input itself, which the model counts once per group of Linears reading it) and for the
trainable and frozen tensors the method adds. memory/activations.py and memory/inventory.py evaluate them
with the real widths, so a new model needs no new rule, and a PEFT release that changes a layer fails
`--check`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from memfit.trace.autocast import CudaAutocastPolicy
from memfit.trace.fact_file import write_or_check
from memfit.trace.peft_terms import SETUPS, agreed, saving_into, tensor_terms, monomial  # noqa: F401 (tests read monomial here)

OUT = Path(__file__).resolve().parent.parent / "facts" / "data" / "peft.toml"
SIZES = {"T": 29, "I": 11, "O": 13, "R": 7}  # tokens, in_features, out_features, rank


def _kron(t, i1, i2, o1, o2, r):
    """LoKr sizes: PEFT factors in = I1*I2 and out = O1*O2 (lokr/layer.py factorization, I1 < I2)."""
    return {"T": t, "I": i1 * i2, "O": o1 * o2, "R": r, "I1": i1, "I2": i2, "O1": o1, "O2": o2}


def _blocks(t, k, b, o):
    """OFT sizes: in = K blocks of B; P = B(B-1)/2, the entries of one skew-symmetric block."""
    return {"T": t, "I": k * b, "O": o, "B": b, "K": k, "P": b * (b - 1) // 2}


def _butterfly(t, k, b, o):
    """BOFT sizes: in = K blocks of B (its rotation blocks are full B x B matrices: no P)."""
    return {"T": t, "I": k * b, "O": o, "B": b, "K": k}


# method -> (two sets of named sizes, each the sizes PEFT sees; the second only checks the first). LoKr's two
# variants are PEFT's two branches of its second factor: low rank (w2_a @ w2_b) when r < max(O2, I2) / 2, else a
# full O2 x I2 matrix; its first factor is full (decompose_both=False, PEFT's default).
LINEAR = (SIZES, {"T": 31, "I": 17, "O": 19, "R": 5})
METHOD_SIZES = {
    "ia3": LINEAR, "ia3_feedforward": LINEAR, "vera": LINEAR, "adalora": LINEAR, "loha": LINEAR,
    "lokr": (_kron(29, 3, 17, 5, 19, 7), _kron(37, 7, 23, 11, 29, 3)),
    "lokr_full": (_kron(29, 3, 11, 5, 13, 17), _kron(37, 5, 11, 3, 13, 29)),
    "oft": (_blocks(29, 7, 5, 13), _blocks(31, 3, 11, 17)),
    "boft": (_butterfly(29, 7, 5, 13), _butterfly(31, 3, 11, 17)),
}


def _configs(sizes: dict) -> dict:
    """PEFT configs of each method for a module named `proj` (the defaults PEFT itself uses otherwise)."""
    import peft

    r = sizes.get("R", 0)
    return {
        "ia3": lambda: peft.IA3Config(target_modules=["proj"], feedforward_modules=[]),
        "ia3_feedforward": lambda: peft.IA3Config(target_modules=["proj"], feedforward_modules=["proj"]),
        "vera": lambda: peft.VeraConfig(r=r, target_modules=["proj"]),
        "adalora": lambda: peft.AdaLoraConfig(init_r=r, target_r=max(1, r // 2), total_step=10,
                                              target_modules=["proj"]),
        "loha": lambda: peft.LoHaConfig(r=r, target_modules=["proj"]),
        "lokr": lambda: peft.LoKrConfig(r=r, target_modules=["proj"]),
        "lokr_full": lambda: peft.LoKrConfig(r=r, target_modules=["proj"]),
        "oft": lambda: peft.OFTConfig(oft_block_size=sizes.get("B", 0), target_modules=["proj"]),
        "boft": lambda: peft.BOFTConfig(boft_block_size=sizes.get("B", 0), target_modules=["proj"]),
    }


class _One(torch.nn.Module):
    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.proj = torch.nn.Linear(fan_in, fan_out, bias=False)

    def forward(self, x):
        return self.proj(x)


def _wrapped(method: str, sizes: dict, frozen, adapter):
    import peft

    model = peft.get_peft_model(_One(sizes["I"], sizes["O"]), _configs(sizes)[method]())
    for p in model.parameters():
        p.data = p.data.to(adapter if p.requires_grad else frozen)
    for name, b in model.named_buffers():  # VeRA's shared projections: a module cast (DeepSpeed) casts them
        if b.is_floating_point() and not name.endswith(KEPT_FP32):  # with the adapters
            b.data = b.data.to(adapter)
    return model


# buffers PEFT creates in fp32 and never casts: BOFT's permutation matrices are not among its adapter names
# (boft/layer.py update_layer: register_buffer("boft_P", torch.empty(...)), so a single-GPU run keeps them fp32
KEPT_FP32 = ("boft_P",)
# a variant is one branch of PEFT's layer: the parameter that branch creates (the sizes must take it)
BRANCH = {"lokr": "lokr_w2_a", "lokr_full": "lokr_w2."}


def _check_branch(method: str, model) -> None:
    names = [n for n, _ in model.named_parameters()]
    if method in BRANCH and not any(BRANCH[method] in n for n in names):
        raise ValueError(f"{method}: these sizes do not take PEFT's branch with {BRANCH[method]} ({names})")


def layer_facts(method: str, autocast: bool, frozen, adapter, sizes: dict = SIZES) -> dict:
    """What one adapted Linear holds: trainable and frozen tensors the method adds, saved tensors of a forward."""
    torch.manual_seed(0)
    with torch.no_grad():
        model = _wrapped(method, sizes, frozen, adapter)
    _check_branch(method, model)
    base = model.base_model.model.proj.base_layer.weight
    x = torch.randn(1, sizes["T"], sizes["I"], dtype=frozen, requires_grad=True)
    x_in = x * 1  # a non-leaf input, as a layer's Linears see
    held = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    saved: list[torch.Tensor] = []
    with saving_into(saved):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), CudaAutocastPolicy():
            model(x_in)
    reads_input = any(t.untyped_storage().data_ptr() == x_in.untyped_storage().data_ptr() for t in saved)
    extra = [t for t in saved if t.untyped_storage().data_ptr() not in held | {x_in.untyped_storage().data_ptr()}]
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen_extra = [p for p in model.parameters() if not p.requires_grad and p is not base]
    frozen_extra += [b for b in model.buffers() if b.numel() > 1]
    return {"trainable": tensor_terms(trainable, sizes), "frozen": tensor_terms(frozen_extra, sizes),
            "saved": tensor_terms(extra, sizes), "saves_input": reads_input}


# few tokens: what backward adds beyond them is weight-sized. Two shapes (in < out, in > out): a method whose
# backward temporaries are not a multiple of its weight-sized product reads differently in the two and fails.
WIDE = ({"T": 16, "I": 1024, "O": 2048, "R": 8}, {"T": 16, "I": 2048, "O": 1024, "R": 8})
WIDE_SIZES = {
    "lokr": (_kron(16, 32, 32, 32, 64, 8), _kron(16, 32, 64, 32, 32, 8)),
    "lokr_full": (_kron(16, 32, 32, 32, 64, 64), _kron(16, 32, 64, 32, 32, 64)),
    "oft": (_blocks(16, 32, 32, 2048), _blocks(16, 64, 32, 1024)),
    "boft": (_butterfly(16, 256, 4, 2048), _butterfly(16, 512, 4, 1024)),
}
# methods whose backward temporaries are as wide as the input on both sides (BOFT's rotation, I x I), read as
# bytes per I*I element instead of weight-sized copies
SQUARE_BACKWARD = ("boft",)


def backward_weight_copies(method: str, autocast: bool, frozen, adapter, wide: dict = WIDE[0]) -> float:
    """Weight-sized tensors (I x O in the adapters' dtype) alive at once in one adapted Linear's backward beyond
    what its forward left (LoHa's HadaWeight.backward: 4), to the nearest half; counted with the trace's
    allocator model (memfit/trace/accountant.py). SQUARE_BACKWARD methods: bytes per I*I element instead."""
    from memfit.trace.accountant import Accountant

    model = _wrapped(method, wide, frozen, adapter)
    _check_branch(method, model)
    x = torch.randn(1, wide["T"], wide["I"], dtype=frozen, requires_grad=True)
    acc = Accountant()
    with acc:
        acc.enter_phase("forward", 0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), CudaAutocastPolicy():
            loss = model(x * 1).float().sum()
        after_forward = acc.live_bytes
        acc.enter_phase("backward", 0)
        loss.backward()
    weight = wide["I"] * wide["O"] * torch.finfo(adapter).bits // 8
    unit = wide["I"] * wide["I"] if method in SQUARE_BACKWARD else weight  # BOFT: bytes per I*I element
    return round(2 * (acc.peaks["0:backward"].total - after_forward) / unit) / 2


def derive() -> dict:
    facts: dict[str, dict] = {}
    for method, size_sets in METHOD_SIZES.items():
        facts[method] = {}
        for name, autocast, frozen, adapter in SETUPS:
            f = agreed(method, name, [layer_facts(method, autocast, frozen, adapter, sizes) for sizes in size_sets])
            wide = WIDE_SIZES.get(method, WIDE)
            copies = agreed(method, name, [backward_weight_copies(method, autocast, frozen, adapter, w) for w in wide])
            f["backward_weights"] = 0 if method in SQUARE_BACKWARD else copies
            f["backward"] = [("I*I", copies)] if method in SQUARE_BACKWARD else []
            facts[method][name] = f
    from memfit.trace import token_facts  # an Embedding, not a Linear: its own derivation

    facts["trainable_tokens"] = token_facts.derive()
    return facts


def _terms(terms) -> str:
    return "[" + ", ".join(f'["{m}", {b}]' for m, b in terms) + "]"


def render(facts: dict) -> str:
    import peft

    lines = ["# What each PEFT method adds to one adapted Linear (T tokens, I in_features, O out_features, R rank;",
             "# LoKr: I = I1*I2, O = O1*O2, PEFT's Kronecker factors; OFT, BOFT: I = K blocks of B, P = B(B-1)/2).",
             "# Each term is [size product, bytes per element]. Written by",
             "# `python -m memfit.trace.peft_facts` (PEFT's own layers run on CPU tensors); do not edit by hand.",
             "#   trainable / frozen  tensors the method adds (frozen: VeRA's shared projections, AdaLoRA's rank,",
             "#                       OFT's int64 block indices, a few KiB a Linear that memory/ leaves out)",
             "#   saved               what a forward keeps for backward beyond the weights and the input itself",
             "#   saves_input         a saved tensor is the layer's input (shared with the other Linears reading it)",
             "#   backward_weights    weight-sized (I*O, adapter dtype) temporaries of the layer's backward",
             "#   backward            BOFT: temporaries of the backward as [I*I, bytes per element] (its rotation)",
             "#   lokr / lokr_full    PEFT's two LoKr branches: r < max(O2, I2) / 2 (low-rank w2), else a full w2",
             "#   boft                I = K blocks of B (PEFT's default B = 4); frozen: its I x I fp32 permutation",
             "#                       buffer, counted beside each adapted Linear (data/adapters.toml frozen_per_linear)",
             f'peft = "{peft.__version__}"', f'torch = "{torch.__version__}"', ""]
    from memfit.trace import token_facts

    for method, setups in facts.items():
        if method == "trainable_tokens":
            lines += token_facts.render(setups, _terms)
            continue
        for setup, f in setups.items():
            lines += [f"[{method}.{setup}]", f"trainable = {_terms(f['trainable'])}", f"frozen = {_terms(f['frozen'])}",
                      f"saved = {_terms(f['saved'])}", f"saves_input = {str(f['saves_input']).lower()}",
                      f"backward_weights = {f['backward_weights']:g}"]
            lines += [f"backward = {_terms([(t, f'{b:g}') for t, b in f['backward']])}"] if f["backward"] else []
            lines += [""]
    return "\n".join(lines)


def derived_text() -> str:
    return render(derive())


def main(argv: list[str] | None = None) -> int:
    return write_or_check(__doc__.splitlines()[0], OUT, derived_text, "PEFT", argv)


if __name__ == "__main__":
    sys.exit(main())
