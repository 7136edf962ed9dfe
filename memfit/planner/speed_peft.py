"""Extra work of the PEFT methods beyond LoRA's two small matmuls, counted from what PEFT 0.21.2 computes in each
forward of an adapted Linear (peft/tuners/*/layer.py). Shapes come from the adapter tensors of
memfit/memory/inventory.py (each names its base module's in / out features and how many layers carry it).

Per adapted module of `in` x `out` features, per forward:
- LoRA / QLoRA (lora/layer.py): x @ A, then @ B: 2 r (in + out) FLOPs a token; backward twice that. Counted by
  speed.py from the adapter parameter count, as before.
- DoRA (lora/dora.py DoraLinearLayer.forward): B @ A rebuilt (2 r in out FLOPs), W + s BA and its column norm
  over the in x out weight (memory-bound, `weight_bytes_per_element` each); with lora_dropout > 0 PEFT runs the
  base matmul again on the dropped-out input (variants.py: base_result=None), a second 2 in out FLOPs a token
  whose input gradient backward also computes.
- OFT (oft/layer.py OFTRotationModule): the input rotated block-wise, einsum over blocks of b: 2 in b FLOPs a
  token; b from the adapter's size (in (b - 1) / 2 skew parameters).
- BOFT (boft/layer.py Linear.forward): the butterfly factors made dense and multiplied: two bmm with the in x in
  permutation per factor, the factors chained, then `@ eye`: (3 N) 2 in^3 FLOPs; then x @ rotation: 2 in^2 a
  token. N from the adapter's size (N K B^2 rotation entries + out scales, B = 4: memfit/facts/data/peft.toml).
- LoHa / LoKr (loha/layer.py, lokr/layer.py `_get_delta_activations`): the full in x out delta weight built
  (LoHa: two rank-r products, 2 x 2 r in out FLOPs), then F.linear(x, delta): 2 in out FLOPs a token, whose
  backward computes the input and the delta-weight gradients (like a trained Linear: 4 in out a token).
- Prompt / P-tuning: the virtual tokens run through every layer as part of each row (speed.py widens the rows).
Backward of the token-independent part is taken as `backward_per_forward` times its forward (the gradient of
each product with respect to its trainable operand).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from memfit.facts.adapters import wraps
from memfit.facts.catalog import ModelSpec
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import tuned_tensors

BOFT_BLOCK = 4  # PEFT's default boft_block_size (memfit/facts/data/peft.toml)


@dataclass(frozen=True)
class AdapterWork:
    """FLOPs and bytes of one micro-step that the base matmuls and LoRA's A/B do not cover."""

    flops_per_token_forward: float = 0.0
    flops_per_token_backward: float = 0.0
    fixed_flops: float = 0.0  # token-independent, forward + backward (weights rebuilt each forward)
    fixed_weight_bytes: float = 0.0  # memory-bound passes over the rebuilt weights, forward + backward


def _modules(tensors) -> dict[str, tuple[int, int, int, int]]:
    """module -> (in, out, layers, adapter elements per layer) of the adapted Linears."""
    out: dict[str, list[int]] = {}
    for t in tensors:
        if t.kind != "lora" or not t.per_layer or not t.trainable:
            continue  # frozen adapter buffers (BOFT's permutation) are no parameters of the method
        entry = out.setdefault(t.module, [0, 0, t.count, 0])
        if t.name.endswith("lora_A"):
            entry[0] = t.in_features
        elif t.name.endswith("lora_B"):
            entry[1] = t.out_features
        elif t.in_features:
            entry[0], entry[1] = t.in_features, t.out_features
        entry[3] += t.numel
    return {k: (v[0], v[1], v[2], v[3]) for k, v in out.items()}


def adapter_work(s: Scenario, constants: dict) -> AdapterWork:
    return _work(s.model, s.tuning, s.lora_rank, s.lora_targets, s.dora, s.lora_dropout > 0, s.releases,
                 constants["backward_per_forward"], constants["weight_bytes_per_element"])


@cache
def _work(model: ModelSpec, tuning: str, rank: int, targets: tuple, dora: bool, dropout: bool, releases: tuple,
          backward_per_forward: float, bytes_per_element: float) -> AdapterWork:
    if wraps(tuning) != "linear" and not (tuning in ("lora", "qlora") and dora):
        return AdapterWork()
    tensors = tuned_tensors(model, tuning, rank, targets, dora, model.num_layers, 20, releases)
    fwd_token = bwd_token = per_forward = weight_bytes = 0.0
    for din, dout, layers, numel in _modules(tensors).values():
        if not din or not dout:
            continue  # not a Linear (an embedding's adapter, a norm's scale): no matmul of its own
        weight = din * dout
        if tuning in ("lora", "qlora") and dora:
            per_forward += layers * 2 * rank * weight
            weight_bytes += layers * weight * bytes_per_element
            if dropout:  # the base matmul again on the dropped-out input, and its input gradient
                fwd_token += layers * 2 * weight
                bwd_token += layers * 2 * weight
        elif tuning == "oft":
            block = 2 * numel / max(din, 1) + 1
            fwd_token += layers * 2 * din * block
            bwd_token += layers * 4 * din * block
        elif tuning == "boft":
            factors = max(1, round((numel - dout) / (din * BOFT_BLOCK)))
            per_forward += layers * 3 * factors * 2 * din ** 3
            weight_bytes += layers * din * din * bytes_per_element * factors
            fwd_token += layers * 2 * din * din
            bwd_token += layers * 4 * din * din
        elif tuning in ("loha", "lokr"):
            if tuning == "loha":
                per_forward += layers * 2 * 2 * rank * weight
            weight_bytes += layers * weight * bytes_per_element
            fwd_token += layers * 2 * weight
            bwd_token += layers * 4 * weight
    return AdapterWork(fwd_token, bwd_token, per_forward * (1 + backward_per_forward),
                       weight_bytes * (1 + backward_per_forward))


def virtual_tokens(s: Scenario) -> int:
    """Tokens a prompt method prepends to every row (they run through every layer, and count as no data)."""
    return s.virtual_tokens if wraps(s.tuning) == "virtual_tokens" else 0
