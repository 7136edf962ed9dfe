"""Checkpointing that keeps saved tensors on the host: HF `offload=True` and Unsloth-style checkpointing.

Both move tensors to host RAM in a CUDA run. `HostTransfer` does the move; the real one copies to
(pinned) CPU memory, the tracer's one makes a host-labelled copy so the accountant does not count it
as device memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint


@dataclass
class HostTransfer:
    to_host: Callable[[torch.Tensor], torch.Tensor]
    to_device: Callable[[torch.Tensor, torch.device], torch.Tensor]


def _real_to_host(t: torch.Tensor, pin: bool = True) -> torch.Tensor:
    # torch.autograd.graph.save_on_cpu(pin_memory=True).pack_to_cpu
    packed = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pin and torch.cuda.is_available())
    packed.copy_(t, non_blocking=packed.is_pinned())
    return packed


REAL_TRANSFER = HostTransfer(_real_to_host, lambda h, device: h.to(device, non_blocking=True))


def _offload(reentrant: bool, host: HostTransfer):
    """transformers `_activation_checkpointing_enable(offload=True)`: save_on_cpu(pin_memory=True) around checkpoint."""

    def pack(t):
        return t.device, host.to_host(t)

    def unpack(packed):
        device, h = packed
        return host.to_device(h, device)

    def checkpoint_func(fn, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return checkpoint(fn, *args, use_reentrant=reentrant, **kwargs)

    return checkpoint_func


class _HostCheckpoint(torch.autograd.Function):
    """LLaMA-Factory `use_unsloth_gc` (model_utils/checkpointing.py UnslothGradientCheckpointing):
    the layer input goes to the host, the layer runs without grad, backward brings the input back,
    recomputes and back-propagates."""

    @staticmethod
    def forward(ctx, forward_function, host, hidden_states, *args):
        saved = host.to_host(hidden_states)
        with torch.no_grad():
            outputs = forward_function(hidden_states, *args)
        ctx.save_for_backward(saved)
        ctx.forward_function, ctx.host, ctx.args, ctx.device = forward_function, host, args, hidden_states.device
        return outputs

    @staticmethod
    def backward(ctx, grad_output):
        (saved,) = ctx.saved_tensors
        hidden_states = ctx.host.to_device(saved, ctx.device).detach()
        hidden_states.requires_grad_(True)
        with torch.enable_grad():
            outputs = ctx.forward_function(hidden_states, *ctx.args)
            outputs = outputs[0] if isinstance(outputs, tuple) else outputs
        torch.autograd.backward(outputs, grad_output)
        return (None, None, hidden_states.grad) + (None,) * len(ctx.args)


def _unsloth(host: HostTransfer):
    def checkpoint_func(fn, hidden_states, *args, **kwargs):
        return _HostCheckpoint.apply(fn, host, hidden_states, *args)

    return checkpoint_func


def checkpoint_function(mode: str, reentrant: bool, host: HostTransfer | None = None):
    host = host or REAL_TRANSFER
    if mode == "offload":
        return _offload(reentrant, host)
    if mode == "unsloth":
        return _unsloth(host)
    raise ValueError(f"no host checkpointing mode {mode!r}")
