"""One trained model's memory over the phases of a training step: model states, activations and overheads
combined into three device profiles per rank (allocated, reserved, device total), each phase a breakdown by
category; the verdict rule compares a peak with capacity. memfit/roles/ puts the roles of a run together.
"""
from __future__ import annotations

import math

from memfit.facts.engines import engine_of
from memfit.facts.frameworks import framework
from memfit.facts.runtime import Runtime
from memfit.memory import overheads
from memfit.memory.activations import Activations
from memfit.breakdown import Breakdown, PhaseProfile
from memfit.memory.inventory import ParamTensor
from memfit.facts.scenario import Scenario
from memfit.memory.states import ModelStates, trainable_dtype_bytes

# The least margin ever called "fits", a share of the card: other processes on the card (a desktop session,
# monitoring agents) hold bytes that scale with the card, not with the run (data/error_allowances.toml). It was
# the whole rule before the error bands; kept as their floor, so a narrow band never calls less a fit.
TIGHT_FRACTION = 0.05


def _static(ms: ModelStates, runtime: int, grads: int = 0, optimizer: int | None = None) -> dict[str, int]:
    return {
        "weights": ms.weights,
        "gradients": grads,
        "optimizer_states": ms.optimizer if optimizer is None else optimizer,
        "engine_buffers": ms.engine_buffers,
        "runtime_overhead": runtime,
    }


def _forward(ms: ModelStates, act: Activations, runtime: int, model_logits: int = 0) -> Breakdown:
    if ms.gathered_loss is not None:
        return _forward_loss_after_root(ms, act, runtime, model_logits)
    parts = _static(ms, runtime, grads=ms.grads_between_steps)
    parts["weights"] += ms.gathered_forward + ms.autocast_cache
    in_layer = act.saved_total - act.outside_layers + act.layer_forward_transient
    at_loss = act.saved_total + act.logits_forward_peak
    if act.embedding_transient > max(at_loss, in_layer):  # PEFT trainable tokens' merged embedding weight
        parts["activations"] = act.embedding_transient
    elif at_loss >= in_layer + act.logits_kept:
        parts["activations"] = act.saved_total
        parts["logits_loss"] = act.logits_forward_peak
    else:
        parts["activations"] = in_layer
    if act.logits_kept and "logits_loss" not in parts:  # the previous step's logits, still referenced (LitGPT)
        parts["logits_loss"] = act.logits_kept
    return Breakdown(parts)


def _forward_loss_after_root(ms: ModelStates, act: Activations, runtime: int, model_logits: int) -> Breakdown:
    """FSDP2 under a loop whose loss runs on the logits the model returned (torchtune): the largest of a layer
    running (its units and the root gathered), the output projection (the root gathered, the model's logits made)
    and the loss (only what the strategy keeps gathered)."""
    assert ms.gathered_loss is not None  # the caller's condition
    parts = _static(ms, runtime, grads=ms.grads_between_steps)
    # a loop that keeps the previous step's logits until the next forward returns (LitGPT) has them while a layer runs
    moments = [dict(parts, weights=parts["weights"] + ms.gathered_forward, logits_loss=act.logits_kept,
                    activations=act.saved_total - act.outside_layers + act.layer_forward_transient),
               # autocast's casts of the head's weight (an fp32 head gathered under autocast) from the head on
               dict(parts, weights=parts["weights"] + ms.gathered_head + ms.autocast_cache, activations=act.saved_total,
                    logits_loss=model_logits, engine_buffers=parts["engine_buffers"] + ms.forward_flat),
               dict(parts, weights=parts["weights"] + ms.gathered_loss + ms.autocast_cache,
                    activations=act.saved_total, logits_loss=act.logits_forward_peak,
                    engine_buffers=parts["engine_buffers"] + ms.forward_flat)]
    return max((Breakdown(p) for p in moments), key=lambda b: b.total)


def _backward(ms: ModelStates, act: Activations, runtime: int, head_grads: int, logits_grad_out: int = 0) -> Breakdown:
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
    sharded = base["weights"] - ms.gathered_backward
    if ms.gathered_backward_start is not None:  # the loss backward runs before the root's pre-backward gathers it
        assert ms.gathered_loss is not None  # FSDP2 sets both (states/fsdp.py)
        start = max((dict(start, weights=sharded + ms.gathered_loss + saved_casts, gradients=ms.grads_between_steps,
                          logits_loss=act.logits_backward_peak),
                     dict(start, weights=sharded + ms.gathered_backward_start + saved_casts,
                          gradients=ms.grads_between_steps + head_grads, logits_loss=act.logits_grad)),
                    key=lambda p: sum(p.values()))
    last_layer_alive = act.layer_checkpoint if act.checkpointed_layers else act.layer_saved
    reduced = ms.grads_after_backward if ms.grads_at_end is None else ms.grads_at_end
    # a recomputed layer's activations include its own weight casts (autocast over fp32 params, recompute_casts)
    end = dict(base, gradients=max(reduced, ms.grads_between_steps) + ms.grads_unreduced,
               activations=max(last_layer_alive + act.recompute + ms.recompute_casts + act.layer_backward_transient
                               + act.shared_masks + ms.layer_inputs_held,
                               act.embedding_transient))  # PEFT trainable tokens: the embedding's V x H gradient
    first_layer = dict(base, weights=base["weights"] + saved_casts - ms.autocast_cache_head,
                       gradients=max(ms.grads_between_steps, head_grads) + ms.top_layer_grads,
                       # the gradient arriving at the layer's output (its input's shape) waits while it recomputes
                       activations=act.saved_total - act.outside_layers + act.output_grad
                       + max(act.recompute + ms.recompute_casts + act.layer_backward_transient,
                             act.layer_forward_transient))
    moments = [start, end, first_layer]
    if ms.regather:  # the root group all-gathered again as the logits' gradient reaches the model's output
        moments.append(dict(base, weights=sharded + ms.regather,
                            gradients=ms.grads_between_steps, activations=act.saved_total, logits_loss=logits_grad_out))
    if ms.tied_embedding_grads:
        # the tied weight's autograd input buffer holds the head's gradient (a transposed view, made at backward's
        # start) when the embedding's dense gradient arrives, and sums the two out of place: three V x H gradients
        # at once, every layer's activations gone (traced: aten.embedding_dense_backward + aten.add.Tensor)
        tied = ms.tied_embedding_grads
        others = max(reduced - tied, ms.grads_between_steps) if ms.grads_before_tied is None else ms.grads_before_tied
        moments.append(dict(base, weights=base["weights"] - ms.gathered_backward + ms.gathered_end,
                            gradients=others + 3 * tied,
                            activations=act.embedding_transient))
    if ms.head_reduce:
        moments.append(dict(base, weights=base["weights"] + saved_casts, activations=act.saved_total,
                            gradients=ms.grads_between_steps + ms.head_reduce))
    if ms.last_reduce or ms.gathered_end:  # gathered params are released and every layer's activations freed by then
        moments.append(dict(base, weights=base["weights"] - ms.gathered_backward + ms.gathered_end,
                            gradients=max(ms.grads_after_backward, ms.grads_between_steps) + ms.last_reduce,
                            activations=ms.layer_inputs_held))  # but those FSDP1's hooks hold to backward's end
    for moment in moments[1:] if act.logits_kept else ():  # a loop that keeps its logits through backward (LitGPT)
        moment["logits_loss"] = moment.get("logits_loss", 0) + act.logits_kept
    return max((Breakdown(p) for p in moments), key=lambda b: b.total)


def _optimizer_step(ms: ModelStates, runtime: int, logits_kept: int = 0) -> Breakdown:
    parts = _static(ms, runtime, grads=max(ms.grads_after_backward, ms.grads_between_steps) + ms.step_grads,
                    optimizer=ms.optimizer + ms.step_temporaries)
    if logits_kept:  # the loop's logits outlive backward (LitGPT)
        parts["logits_loss"] = logits_kept
    return Breakdown(parts)


def _head_grads(s: Scenario, tensors: list[ParamTensor]) -> int:
    """Gradient bytes made by the output head's backward, before any layer's: its weight's (the
    embedding's when tied)."""
    kind = "embedding" if s.model.tie_embeddings else "lm_head"
    head = [t for t in tensors if t.trainable and t.kind == kind and t.name != "embed_positions.weight"]
    return engine_of(s).head_grads_held(s, sum(t.total * trainable_dtype_bytes(s, t) for t in head))


def _model_logits(s: Scenario, grad: bool = False) -> int:
    """The logits a torchtune model returns (chunked: the output projection's bf16 chunks; else
    `self.output(h).float()`, the bf16 logits alive beside their fp32 cast), or their gradient as it reaches the
    model's output (the chunked loss casts each chunk's gradient back to the chunk's dtype; transformer.py)."""
    n, v, b = s.micro_batch * s.seq_len, s.model.vocab_size, s.compute_bytes
    if framework(s.profile).fsdp.get("wrapping") == "accelerate":  # a transformers model: its loss runs inside
        return 0  # forward, on logits the loss moment counts (none at all under a fused loss)
    if s.loss == "chunked_output":
        return n * v * b
    return n * v * 4 if grad else n * v * (b + 4)


def allocated_profile(s: Scenario, tensors: list[ParamTensor], ms: ModelStates, act: Activations) -> PhaseProfile:
    runtime = overheads.cublas_workspace(s.hardware.gpu)
    # the fp32 master (one of the optimizer's three fp32 copies) exists once the engine starts
    load = Breakdown(_static(ms, runtime, optimizer=ms.optimizer // 3 if engine_of(s).master_at_load(s) else 0))
    load = max([load] + [Breakdown(m | {"runtime_overhead": runtime}) for m in ms.load_moments], key=lambda b: b.total)
    steady = Breakdown(_static(ms, runtime))
    return PhaseProfile({
        "load": load,
        "forward": _forward(ms, act, runtime, _model_logits(s)),
        "backward": _backward(ms, act, runtime, _head_grads(s, tensors) if ms.head_grads is None else ms.head_grads,
                              _model_logits(s, grad=True)),
        "optimizer_step": _optimizer_step(ms, runtime, act.logits_kept),
        "checkpoint_save": steady,
        "resume": steady,
    })


def _churn(b: Breakdown, ms: ModelStates) -> int:
    """Bytes at this moment that are allocated and freed within a step (what fragments the cache)."""
    return (b.get("activations") + b.get("logits_loss") + ms.step_grads + ms.step_temporaries
            + ms.gathered_forward + max(ms.grads_unreduced, ms.head_reduce, ms.last_reduce))


def reserved_profile(alloc: PhaseProfile, ms: ModelStates, rt: Runtime, tuning: str | None = None) -> PhaseProfile:
    """Each phase's allocated plus the cache the allocator cannot give back beside it: a share of the phase's churn,
    the one a replay of traced runs of that `tuning` derived (memfit/trace/allocator_reserve.py), the least reserve
    the run fits in. A card with room to spare shows more reserved: cache the allocator frees before it fails."""
    return PhaseProfile({
        phase: b.plus("runtime_overhead", overheads.allocator_cache(_churn(b, ms), rt, tuning))
        for phase, b in alloc.phases.items()
    })


def required_margin(peak: int, capacity: int, band: float) -> int:
    """The margin a run needs to be called "fits": its error band of the estimated device total, at least the
    card floor."""
    return max(math.ceil(band * peak), math.ceil(TIGHT_FRACTION * capacity))


def verdict_of(margin: int, capacity: int, host_margin: int | None, band: float) -> str:
    """The verdict: "oom" when the estimate is over the card, "host_oom" when host RAM is; "fits" only when the
    margin clears the run's error band (memfit/facts/error_bands.py), "tight" inside it."""
    if margin < 0:
        return "oom"
    if host_margin is not None and host_margin < 0:
        return "host_oom"
    return "fits" if margin >= required_margin(capacity - margin, capacity, band) else "tight"
