"""Derive what PEFT's trainable tokens hold, by running PEFT's own TrainableTokensLayer (written into
data/peft.toml by `python -m memfit.trace.peft_facts`, beside the Linear methods).

An `nn.Embedding(V, H)` is wrapped by TrainableTokensLayer with N token indices, and a Linear head sharing its
weight is wrapped by a second layer tied to the first, as peft/tuners/trainable_tokens/model.py inject_adapter
does for a model with tie_word_embeddings. Each forward builds the full merged weight (index_copy of the N
trained rows into a copy of the V x H weight): what the forward keeps of it, and what each backward makes beside
it, are read from PEFT's real layers under each precision setup of peft_terms.SETUPS.

Saved tensors and the tensors the method adds are read as products of named sizes (T tokens, V vocabulary,
H hidden, N rows; distinct primes, two sets that must agree), as peft_facts does. Transients (the forward's
merged weight that the embedding drops, the V x H weight gradient each backward makes before selecting its N
rows) are read with the trace's allocator model on wide sizes, as bytes per V*H element, to the nearest half.
"""
from __future__ import annotations

import torch

from memfit.trace.peft_terms import SETUPS, agreed, saving_into, tensor_terms

SIZES = ({"T": 29, "V": 37, "H": 11, "N": 5}, {"T": 31, "V": 41, "H": 13, "N": 3})
# few tokens and rows: what a forward or backward makes beyond them is weight-sized (T*V / V*H = T/H < 2%)
WIDE = ({"T": 8, "V": 4096, "H": 512, "N": 8}, {"T": 8, "V": 2048, "H": 1024, "N": 8})


def _layers(sizes: dict, frozen, adapter):
    """PEFT's embedding layer and the head layer tied to it, in the setup's dtypes (adapter: the trained rows)."""
    from peft import TrainableTokensConfig
    from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

    torch.manual_seed(0)
    config = TrainableTokensConfig(token_indices=list(range(sizes["N"])))
    embedding = torch.nn.Embedding(sizes["V"], sizes["H"], dtype=frozen)
    head = torch.nn.Linear(sizes["H"], sizes["V"], bias=False, dtype=frozen)
    head.weight = embedding.weight
    embedding.weight.requires_grad_(False)
    with torch.no_grad():
        emb = TrainableTokensLayer(embedding, "default", config=config)
        emb.update_layer("default", config=config)
        tied = TrainableTokensLayer(head, "default", config=config, tied_adapter=emb)
        tied.update_layer("default", config=config, tied_adapter=emb)
        delta = emb.trainable_tokens_delta["default"]
        delta.data = delta.data.to(adapter)
    return emb, tied


def _inputs(which: str, sizes: dict, frozen):
    if which == "embedding":
        return torch.randint(0, sizes["V"], (1, sizes["T"]))
    return torch.randn(1, sizes["T"], sizes["H"], dtype=frozen, requires_grad=True) * 1  # a non-leaf hidden state


def held_facts(autocast: bool, frozen, adapter, sizes: dict) -> dict:
    """Trained and frozen tensors the method adds, and what each layer's forward saves beyond its input and the
    model's own weight."""
    emb, tied = _layers(sizes, frozen, adapter)
    held = {t.untyped_storage().data_ptr() for t in [*emb.parameters(), *emb.buffers()]}
    out = {"trainable": tensor_terms(list(emb.trainable_tokens_delta.values()), sizes),
           "frozen": tensor_terms(list(emb.trainable_tokens_original.values()), sizes)}
    for which, layer in (("embedding", emb), ("head", tied)):
        x = _inputs(which, sizes, frozen)
        saved: list[torch.Tensor] = []
        with saving_into(saved):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                layer(x)
        skip = held | {x.untyped_storage().data_ptr()}
        out[f"{which}_saved"] = tensor_terms([t for t in saved if t.untyped_storage().data_ptr() not in skip], sizes)
    return out


def transient_bytes(which: str, autocast: bool, frozen, adapter, wide: dict) -> tuple[float, float]:
    """(forward, backward) bytes per V*H element that one layer's forward drops and its backward makes beyond
    what its forward left, to the nearest half."""
    from memfit.trace.accountant import Accountant

    emb, tied = _layers(wide, frozen, adapter)
    layer = emb if which == "embedding" else tied
    x = _inputs(which, wide, frozen)
    acc = Accountant()
    with acc:
        acc.enter_phase("forward", 0)
        before = acc.live_bytes
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = layer(x)
        loss = out.float().sum()
        after_forward = acc.live_bytes
        acc.enter_phase("backward", 0)
        loss.backward()
    unit = wide["V"] * wide["H"] / 2
    forward = acc.peaks["0:forward"].total - max(after_forward, before)
    return round(forward / unit) / 2, round((acc.peaks["0:backward"].total - after_forward) / unit) / 2


def derive() -> dict:
    facts = {}
    for name, autocast, frozen, adapter in SETUPS:
        f = agreed("trainable_tokens", name, [held_facts(autocast, frozen, adapter, s) for s in SIZES])
        for which in ("embedding", "head"):
            forward, backward = agreed("trainable_tokens", name,
                                        [transient_bytes(which, autocast, frozen, adapter, w) for w in WIDE])
            f[f"{which}_forward"] = [("V*H", forward)] if forward else []
            f[f"{which}_backward"] = [("V*H", backward)] if backward else []
        facts[name] = f
    return facts


KEYS = ("trainable", "frozen", "embedding_saved", "head_saved", "embedding_forward", "embedding_backward",
        "head_forward", "head_backward")
HEADER = [
    "# trainable_tokens: PEFT TrainableTokensLayer on the input embedding (V vocabulary, H hidden, N trained rows,",
    "# T tokens) and the layer tied to it on a tied output head; derived by memfit/trace/token_facts.py.",
    "#   embedding_saved / head_saved        what each forward keeps beyond its input and the model's weight",
    "#   embedding_forward / head_forward    bytes per V*H element a forward makes and drops (the merged weight)",
    "#   embedding_backward / head_backward  bytes per V*H element a backward makes beyond what its forward left",
]


def render(facts: dict, terms) -> list[str]:
    lines = list(HEADER)
    for setup, f in facts.items():
        lines += [f"[trainable_tokens.{setup}]"]
        lines += [f"{key} = {terms([(t, f'{b:g}') for t, b in f[key]])}" for key in KEYS] + [""]
    return lines
