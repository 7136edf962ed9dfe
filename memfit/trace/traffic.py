"""Bytes the memory-bound kernels of a decoder layer move per token: counted from the real step, not assumed.

The step-time model (planner/speed.py) charges the element-wise work of a layer (norms, activation function,
residual adds, RoPE, casts, LoRA's dropout and adds) as bytes over memory bandwidth. This counts those bytes in
transformers' and PEFT's own code: a real CPU run of `memfit.trace.run.run_trace` (tiny model, CUDA's autocast
policy) under a dispatch mode that adds, for every aten op that is neither a matmul nor an attention kernel nor a
view, the bytes of its tensor inputs and outputs - what a GPU kernel reads and writes when nothing is fused, as in
eager PyTorch. Two layer counts and two sequence lengths cancel what is per weight (dequantization, gradient
buffers, casts of weights) and what lies outside the layers (embedding, loss), leaving bytes per token per layer.

    python -m memfit.trace.traffic      prints forward / backward bytes per token, layer and unit of hidden size
                                        for each kind of step in GRID, with the library versions

Not yet read by speed.py, whose speed.toml [compute] elementwise_bytes_per_token_layer_hidden = 40 (forward and
backward together) is what this counts as 549 (full, 16-bit residual) to 1,428 (PEFT LoRA on every Linear with
dropout, fp32 residual). Wired in and recalibrated (tools/calibrate_speed.py), bench/throughput.py went from 6 to 7
of 12 decisions right, worst miss 19.7% -> 13.1%, with the A100 mfu refitted to 0.86; it also moved the golden
plans and two fit fixtures, so it waits for a change that re-checks those.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memfit.facts.catalog import GpuSpec, ModelSpec
from memfit.facts.scenario import Hardware, Scenario

# kernels whose time the step-time model counts as FLOPs (matmuls, attention), not as element-wise bytes
_COMPUTE = ("mm", "addmm", "bmm", "baddbmm", "scaled_dot_product", "flash_attention", "efficient_attention")
_FREE = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")  # allocate only
LINEARS = {"q_proj": ["q"], "k_proj": ["k"], "v_proj": ["v"], "o_proj": ["o"],
           "gate_proj": ["gate"], "up_proj": ["up"], "down_proj": ["down"]}
# Mistral-7B's proportions (intermediate 3.5 x hidden, 4 query heads per kv head, head_dim 128) at 1/16 width
MODEL = ModelSpec(id="traffic/mistral-shape", arch="llama", hidden_size=256, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=128, intermediate_size=896, vocab_size=512, linear_names=LINEARS)
LAYERS, TOKENS = (1, 2), (64, 128)


def _is_view(func) -> bool:
    returns = func._schema.returns
    return any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _bytes(values) -> int:
    leaves, _ = tree_flatten(values)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class TrafficCounter(TorchDispatchMode):
    """Bytes read + written by memory-bound aten ops, per phase of the step (set by `phase`)."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not (_is_view(func) or name in _FREE or any(k in name for k in _COMPUTE)):
            moved = _bytes((args, kwargs)) + (0 if name.endswith("_") else _bytes(out))  # in-place: written once
            self.bytes[self.phase] = self.bytes.get(self.phase, 0) + moved
        return out

    def mark(self, mark: str, _acc) -> None:
        self.phase = {"forward_end": "backward", "backward_end": "step"}.get(mark, self.phase)


@dataclass(frozen=True)
class LayerTraffic:
    forward: float  # bytes per token per layer per unit of hidden size
    backward: float


def _count(s: Scenario, layers: int, tokens: int) -> dict[str, int]:
    from memfit.trace.run import run_trace

    s = replace(s, model=replace(s.model, num_layers=layers), seq_len=tokens)
    counter = TrafficCounter()
    with counter:
        run_trace(s, steps=1, fake=False, inspect=counter.mark)
    return counter.bytes


def layer_traffic(s: Scenario) -> LayerTraffic:
    """Per token, per decoder layer, per unit of hidden size: the double difference over layers and tokens."""
    (l1, l2), (t1, t2) = LAYERS, TOKENS
    c = {(n, t): _count(s, n, t) for n in LAYERS for t in TOKENS}

    def per(phase: str) -> float:
        dd = (c[l2, t2][phase] - c[l1, t2][phase]) - (c[l2, t1][phase] - c[l1, t1][phase])
        return dd / ((l2 - l1) * (t2 - t1) * s.micro_batch * s.model.hidden_size)

    return LayerTraffic(forward=per("forward"), backward=per("backward"))


def scenario(**knobs) -> Scenario:
    """A step as most measured rows run it: HF Trainer's bf16 autocast over bf16 weights, SDPA, packed rows,
    LoRA (dropout 0.1) on the attention projections."""
    gpu = GpuSpec(id="a100", name="A100", memory_bytes=80 * 2**30, compute_capability=8.0)
    base: dict[str, Any] = dict(model=MODEL, hardware=Hardware(gpu), tuning="lora", lora_targets=ATTENTION,
                                lora_dropout=0.1, precision="bf16-pure", autocast=True, optimizer="adamw-foreach",
                                attention="sdpa", padding="packed", micro_batch=1, seq_len=TOKENS[0])
    return Scenario(**(base | knobs))


ATTENTION = ("q", "k", "v", "o")
ALL = (*ATTENTION, "gate", "up", "down")
# the kinds of step counted: kind (full: no adapter ops; lora: PEFT LoRA over 16-bit Linear; qlora: over 4-bit),
# the residual stream's dtype (16; 32: fp32 weights in the module, or PEFT's k-bit upcast), then for the adapter
# kinds the adapted Linears (the attention projections, or every Linear: -all) and PEFT's LoRA dropout (identity
# at 0, an fp32 mask and product otherwise: -dropout)
RESIDUAL = {16: {}, 32: dict(precision="bf16-mixed", autocast=False, frozen_fp32=True)}


def _grid() -> dict[str, dict[str, Any]]:
    grid: dict[str, dict[str, Any]] = {"full-16": dict(tuning="full"),
                                       "full-32": dict(tuning="full", precision="bf16-mixed", autocast=False)}
    for kind in ("lora", "qlora"):
        for bits, knobs in RESIDUAL.items():
            if kind == "qlora":  # the 4-bit base stays 4-bit; PEFT's k-bit preparation makes the rest fp32
                knobs = dict(tuning="qlora", kbit_upcast=bits == 32)
            for targets, tail in ((ATTENTION, ""), (ALL, "-all")):
                for dropout, more in ((0.0, ""), (0.1, "-dropout")):
                    grid[f"{kind}-{bits}{tail}{more}"] = knobs | dict(lora_targets=targets, lora_dropout=dropout)
    return grid


GRID = _grid()


def derived() -> dict[str, LayerTraffic]:
    return {key: layer_traffic(scenario(**knobs)) for key, knobs in GRID.items()}


def _versions() -> str:
    from memfit.facts.versions import installed

    v = installed()
    return ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "peft") if k in v)


def main(argv: list[str] | None = None) -> int:
    del argv  # no options
    print(f"# bytes per token, decoder layer and unit of hidden size; counted by python -m memfit.trace.traffic "
          f"({_versions()})")
    print(f"{'step':<22}{'forward':>9}{'backward':>10}")
    for key, t in derived().items():
        print(f"{key:<22}{t.forward:>9.1f}{t.backward:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
