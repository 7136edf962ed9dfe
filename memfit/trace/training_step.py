"""One traced training step, the same for every framework's step (run.py's HF Trainer step, the remote-code
families' files, torchtune.py's recipe): the state labelled at both ends, the phases and their marks, the hooks that
label gradients and the logits/loss region, and the loop over steps that the trace JSON comes from."""
from __future__ import annotations

import warnings
from contextlib import nullcontext

import torch

from memfit.trace.accountant import Accountant
from memfit.trace.build import BuiltModel
from memfit.trace.cuda import emulate_cuda


def _host_scalar_steps(optimizer) -> bool:
    """torch keeps Adam's `step` counters on the CPU unless fused or capturable (adam.py _init_group)."""
    group = optimizer.param_groups[0]
    return not (group.get("fused") or group.get("capturable"))


def label_model_state(acc: Accountant, model: torch.nn.Module, optimizers) -> None:
    """At a step boundary: parameters and buffers are weights, .grad gradients, optimizer state states."""
    for p in model.parameters():
        acc.register(p, "weights")
        if p.grad is not None:
            acc.register(p.grad, "gradients")
    for b in model.buffers():
        acc.register(b, "weights")
    for optimizer in optimizers:
        host_steps = _host_scalar_steps(optimizer)
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    acc.register(value, "optimizer_states")
                    if key == "step" and host_steps:
                        acc.exclude(value)


def _install_hooks(acc: Accountant, built: BuiltModel, reference: BuiltModel | None = None) -> list:
    """Gradients are labelled when autograd stores them; the lm_head + loss region is logits_loss (the reference's
    lm_head too: its logits under no_grad feed the loss)."""
    handles = []
    for p in built.trainable:
        handles.append(p.register_post_accumulate_grad_hook(lambda param: acc.label(param.grad, "gradients")))

    def enter_logits(module, args):
        acc.region = "logits_loss"
        hidden = args[0] if args else None
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            # the gradient reaching lm_head's input ends the logits/loss part of backward
            hidden.register_hook(lambda grad: setattr(acc, "region", "activations"))

    handles.append(built.lm_head.register_forward_pre_hook(enter_logits))
    if reference is not None:
        handles.append(reference.lm_head.register_forward_pre_hook(lambda *_: setattr(acc, "region", "logits_loss")))
    return handles


def traced_step(acc, step, target, label_state, new_batch, forward_loss, optimizer_step, context=None) -> dict:
    """One training step's phases and marks, the same for every framework's step (hf_step, torchtune.py's recipe):
    `label_state()` at both ends, `new_batch()` made in forward, `forward_loss(batch)` under CUDA emulation (and
    `context`), backward from the loss, `optimizer_step()`; marks at forward_end, backward_end and step_end.
    The batch and the loss are freed here, at the moments the marks see (neither callable may keep them).
    Returns the attention kernels chosen."""
    label_state()
    acc.enter_phase("forward", step)
    batch = new_batch()
    with emulate_cuda(target, acc, batch.real_tokens, batch.indices) as cuda_state, context or nullcontext():
        loss = forward_loss(batch)
        acc.region = "activations"
        del batch
        _mark(acc, "forward_end", step)
        acc.enter_phase("backward")
        acc.region = "logits_loss"
        loss.backward()
        _mark(acc, "backward_end", step)
        del loss
        acc.enter_phase("optimizer_step")
        optimizer_step()
        _mark(acc, "step_end", step)
    label_state()
    return dict(cuda_state.kernels)


def origins_accountant(origins: bool, steps: int) -> tuple[Accountant, dict]:
    """An Accountant, and with `origins` the live storages (bytes, category, origin) at each mark of the last step."""
    acc = Accountant(debug=origins)
    live: dict = {}
    if origins:
        acc.inspect = lambda mark, a: live.__setitem__(mark, a.live()) if a.step == steps - 1 else None
    return acc, live


def run_steps(acc: Accountant, built: BuiltModel, steps: int, step, fake_mode=None,
              reference: BuiltModel | None = None) -> tuple[dict, dict, dict]:
    """`step(i)` for each of `steps` under `fake_mode` and the accountant, with run_trace's hooks on `built` (and
    `reference`), every warning silenced (a remote file's own notices: the remote-code traces run this). The last
    step's phase peaks and marks as JSON, and its kernels."""
    handles = _install_hooks(acc, built, reference)
    kernels: dict = {}
    try:
        with warnings.catch_warnings(), fake_mode or nullcontext(), acc:
            warnings.simplefilter("ignore")
            for i in range(steps):
                kernels = step(i)
    finally:
        for h in handles:
            h.remove()
    last = steps - 1
    marks = {n.split("@")[0]: b.to_json() for n, b in acc.marks.items() if n.endswith(f"@{last}")}
    return {p: b.to_json() for p, b in acc.profile(last).phases.items()}, marks, kernels


def _mark(acc: Accountant, name: str, step: int) -> None:
    acc.mark(f"{name}@{step}")
    if acc.inspect is not None:
        with acc.paused():
            acc.inspect(name, acc)
