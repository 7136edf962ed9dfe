"""Combine model states, activations and overheads over the phases of a training step.

The result per rank is three device profiles (allocated, reserved, device total) and one host profile
per node, each phase a breakdown by category; the verdict compares the peaks with capacity.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.facts.engines import engine_of
from memfit.memory import overheads
from memfit.memory.activations import Activations, activations
from memfit.breakdown import Breakdown, PhaseProfile
from memfit.memory.inventory import ParamTensor, scenario_tensors
from memfit.facts.scenario import Scenario
from memfit.memory.states import ModelStates, model_states, trainable_dtype_bytes

TIGHT_FRACTION = 0.05  # under 5% of the card left counts as "tight"


@dataclass
class Estimate:
    scenario: Scenario
    total_params: int
    trainable_params: int
    allocated: PhaseProfile
    reserved: PhaseProfile
    device_total: PhaseProfile
    host: PhaseProfile  # per node
    verdict: str
    margin_bytes: int
    host_margin_bytes: int | None
    assumptions: list[str] = field(default_factory=list)

    @property
    def peak_phase(self) -> str:
        return self.device_total.peak_phase

    def to_json(self) -> dict:
        s = self.scenario
        return {
            "schema": "memfit.memory.estimate/1",
            "model": s.model.id,
            "gpu": s.hardware.gpu.name,
            "gpu_memory_bytes": s.hardware.gpu.memory_bytes,
            "gpus_per_node": s.hardware.gpus_per_node,
            "nodes": s.hardware.nodes,
            "params": {"total": self.total_params, "trainable": self.trainable_params},
            "per_rank": {
                "allocated": self.allocated.to_json(),
                "reserved": self.reserved.to_json(),
                "device_total": self.device_total.to_json(),
            },
            "host_per_node": self.host.to_json(),
            "host_ram_bytes": s.hardware.host_ram,
            "verdict": self.verdict,
            "margin_bytes": self.margin_bytes,
            "host_margin_bytes": self.host_margin_bytes,
            "assumptions": list(self.assumptions),
        }


def _static(ms: ModelStates, runtime: int, grads: int = 0, optimizer: int | None = None) -> dict[str, int]:
    return {
        "weights": ms.weights,
        "gradients": grads,
        "optimizer_states": ms.optimizer if optimizer is None else optimizer,
        "engine_buffers": ms.engine_buffers,
        "runtime_overhead": runtime,
    }


def _forward(ms: ModelStates, act: Activations, runtime: int) -> Breakdown:
    parts = _static(ms, runtime, grads=ms.grads_between_steps)
    parts["weights"] += ms.gathered_forward + ms.autocast_cache
    in_layer = act.saved_total - act.outside_layers + act.layer_forward_transient
    at_loss = act.saved_total + act.logits_forward_peak
    if at_loss >= in_layer:
        parts["activations"] = act.saved_total
        parts["logits_loss"] = act.logits_forward_peak
    else:
        parts["activations"] = in_layer
    return Breakdown(parts)


def _backward(ms: ModelStates, act: Activations, runtime: int, head_grads: int) -> Breakdown:
    """The largest of: backward's start (loss gradients over every saved activation), its end (all
    gradients, the first layer recomputed and differentiated), and, where an engine reduces gradients
    in flight, the head's reduction (activations still saved) and the last one (activations gone)."""
    base = _static(ms, runtime)
    base["weights"] += ms.gathered_backward
    base["engine_buffers"] += ms.backward_buffers
    # autocast's weight copies stay saved into backward; checkpointed layers drop theirs (recomputed)
    saved_casts = ms.autocast_cache if act.checkpointed_layers == 0 else ms.autocast_cache_head
    # the loss backward peaks before the head's weight gradient exists; when it is made, the logits'
    # gradient is what is left of the loss buffers
    loss_part = max(act.logits_backward_peak, act.logits_grad + head_grads)
    start = dict(base, weights=base["weights"] + saved_casts, gradients=ms.grads_between_steps,
                 activations=act.saved_total, logits_loss=loss_part)
    if act.logits_grad + head_grads > act.logits_backward_peak:
        start.update(gradients=ms.grads_between_steps + head_grads, logits_loss=act.logits_grad)
    last_layer_alive = act.layer_checkpoint if act.checkpointed_layers else act.layer_saved
    end = dict(base, gradients=max(ms.grads_after_backward, ms.grads_between_steps) + ms.grads_unreduced,
               activations=last_layer_alive + act.recompute + act.layer_backward_transient + act.shared_masks)
    first_layer = dict(base, weights=base["weights"] + saved_casts - ms.autocast_cache_head,
                       gradients=max(ms.grads_between_steps, head_grads),
                       # the gradient arriving at the layer's output (its input's shape) waits while it recomputes
                       activations=act.saved_total - act.outside_layers + act.output_grad
                       + max(act.recompute + act.layer_backward_transient, act.layer_forward_transient))
    moments = [start, end, first_layer]
    if ms.head_reduce:
        moments.append(dict(base, weights=base["weights"] + saved_casts, activations=act.saved_total,
                            gradients=ms.grads_between_steps + ms.head_reduce))
    if ms.last_reduce:  # gathered params are released and every layer's activations freed by then
        moments.append(dict(base, weights=base["weights"] - ms.gathered_backward,
                            gradients=max(ms.grads_after_backward, ms.grads_between_steps) + ms.last_reduce))
    return max((Breakdown(p) for p in moments), key=lambda b: b.total)


def _optimizer_step(ms: ModelStates, runtime: int) -> Breakdown:
    parts = _static(ms, runtime, grads=max(ms.grads_after_backward, ms.grads_between_steps) + ms.step_grads,
                    optimizer=ms.optimizer + ms.step_temporaries)
    return Breakdown(parts)


def _head_grads(s: Scenario, tensors: list[ParamTensor]) -> int:
    """Gradient bytes made by the output head's backward, before any layer's: its weight's (the
    embedding's when tied)."""
    kind = "embedding" if s.model.tie_embeddings else "lm_head"
    head = [t for t in tensors if t.trainable and t.kind == kind and t.name != "embed_positions.weight"]
    return engine_of(s).head_grads_held(s, sum(t.total * trainable_dtype_bytes(s, t) for t in head))


def allocated_profile(s: Scenario, tensors: list[ParamTensor], ms: ModelStates, act: Activations) -> PhaseProfile:
    runtime = overheads.cublas_workspace(s.hardware.gpu)
    # the fp32 master (one of the optimizer's three fp32 copies) exists once the engine starts
    load = Breakdown(_static(ms, runtime, optimizer=ms.optimizer // 3 if engine_of(s).master_at_load(s) else 0))
    load = load.plus("engine_buffers", ms.load_transient)
    steady = Breakdown(_static(ms, runtime))
    return PhaseProfile({
        "load": load,
        "forward": _forward(ms, act, runtime),
        "backward": _backward(ms, act, runtime, _head_grads(s, tensors)),
        "optimizer_step": _optimizer_step(ms, runtime),
        "checkpoint_save": steady,
        "resume": steady,
    })


def _churn(b: Breakdown, ms: ModelStates) -> int:
    """Bytes at this moment that are allocated and freed within a step (what fragments the cache)."""
    return (b.get("activations") + b.get("logits_loss") + ms.step_grads + ms.step_temporaries
            + ms.gathered_forward + max(ms.grads_unreduced, ms.head_reduce, ms.last_reduce))


def reserved_profile(alloc: PhaseProfile, ms: ModelStates) -> PhaseProfile:
    return PhaseProfile({
        phase: b.plus("runtime_overhead", overheads.allocator_cache(_churn(b, ms)))
        for phase, b in alloc.phases.items()
    })


def device_total_profile(s: Scenario, reserved: PhaseProfile, ms: ModelStates) -> PhaseProfile:
    context, nccl = overheads.non_torch_device_bytes(s.world_size, s.hardware.nodes)
    return PhaseProfile({
        phase: b.plus("runtime_overhead", context + nccl).plus("optimizer_states", ms.paged_optimizer)
        for phase, b in reserved.phases.items()
    })


def estimate(s: Scenario) -> Estimate:
    from memfit.memory.host import host_profile  # host accounting reads the same states

    tensors = scenario_tensors(s)
    ms = model_states(s, tensors)
    act = activations(s, [t for t in tensors if t.kind == "lora"])
    alloc = allocated_profile(s, tensors, ms, act)
    reserved = reserved_profile(alloc, ms)
    total = device_total_profile(s, reserved, ms)
    host = host_profile(s, tensors, ms, act)
    capacity = s.hardware.gpu.memory_bytes
    margin = capacity - total.peak.total
    host_margin = None if s.hardware.host_ram is None else s.hardware.host_ram - host.peak.total
    return Estimate(
        scenario=s,
        total_params=sum(t.total for t in tensors if t.kind != "lora"),
        trainable_params=sum(t.total for t in tensors if t.trainable),
        allocated=alloc,
        reserved=reserved,
        device_total=total,
        host=host,
        verdict=verdict_of(margin, capacity, host_margin),
        margin_bytes=margin,
        host_margin_bytes=host_margin,
        assumptions=list(s.assumed) + ms.notes,
    )


def verdict_of(margin: int, capacity: int, host_margin: int | None) -> str:
    if margin < 0:
        return "oom"
    if host_margin is not None and host_margin < 0:
        return "host_oom"
    return "tight" if margin < TIGHT_FRACTION * capacity else "fits"
