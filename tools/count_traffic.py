"""Bytes the memory-bound kernels of a decoder layer move per token: counted from the real step, not assumed.

The step-time model (planner/speed.py) charges the element-wise work of a layer (norms, activation function,
residual adds, RoPE, casts, LoRA's dropout and adds) as bytes over memory bandwidth. This counts those bytes in
transformers' and PEFT's own code: a real CPU run of `memfit.trace.run.run_trace` (tiny model, CUDA's autocast
policy) under a dispatch mode that adds, for every aten op that is neither a matmul nor an attention kernel nor a
view, the bytes of its tensor inputs and outputs - what a GPU kernel reads and writes when nothing is fused, as in
eager PyTorch. Two layer counts and two sequence lengths cancel what is per weight (dequantization, gradient
buffers, casts of weights) and what lies outside the layers (embedding, loss), leaving bytes per token per layer.

    python tools/count_traffic.py            prints speed.toml's [compute] element-wise rows, with the versions
    python tools/count_traffic.py --check    says which shipped rows a new count moves (exit 1 if any)

speed.py reads the rows by kind of step (GRID). Before they were counted, speed.toml assumed 40 bytes for forward
and backward together, where this counts 549 (full, 16-bit residual) to 1,306 (PEFT LoRA on every Linear with
dropout, fp32 residual).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # memfit, when run as a script

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from memfit.facts.catalog import GpuSpec, ModelSpec  # noqa: E402
from memfit.facts.scenario import Hardware, Scenario  # noqa: E402

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
# speed.toml [compute] keys: kind (full: no adapter ops; lora: PEFT LoRA over 16-bit Linear; qlora: over 4-bit),
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
    args = sys.argv[1:] if argv is None else argv
    counted = derived()
    if "--check" not in args:
        print(f"# counted by python tools/count_traffic.py ({_versions()})")
        for phase in ("forward", "backward"):
            print("\n".join(f"elementwise_{phase}.{k} = {getattr(t, phase):.1f}" for k, t in counted.items()))
        return 0
    from memfit.planner.speed_constants import assumptions

    shipped = assumptions()["compute"]
    moved = [f"{k} {phase}: {shipped[f'elementwise_{phase}'].get(k)} -> {getattr(t, phase):.1f}"
             for k, t in counted.items() for phase in ("forward", "backward")
             if abs(shipped[f"elementwise_{phase}"].get(k, -1.0) - getattr(t, phase)) > 0.05]
    print("\n".join(moved) or f"speed.toml [compute] element-wise rows: as counted ({_versions()})")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
