"""FSDP2: params, grads and optimizer states sharded over the ranks, one unit gathered at a time
(docs/knobs.md B; measured: memfit/measure/FINDINGS.md)."""
from __future__ import annotations

from memfit.facts.engines import engine_of
from memfit.facts.frameworks import framework, model_code
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import ParamTensor
from memfit.memory.states import accelerate_fsdp, fsdp_units, plain
from memfit.memory.states.common import (HostBuffer, ModelStates, frozen_bytes, layer_elements, quantized_bytes,
                                         torch_optimizer, trainable_dtype_bytes)


def _gathered_layer_bytes(s: Scenario, tensors: list[ParamTensor]) -> float:
    """Bytes of one gathered FSDP unit: quantized linears travel packed (bnb quant_storage / GPTQ qweight),
    the rest in the dtype the strategy gathers in (fsdp_units.gathered_bytes: the compute dtype, or a framework's)."""
    b = fsdp_units.gathered_bytes(s)
    per = [t.total * (quantized_bytes(s) if t.quantized else b) for t in tensors if t.per_layer]
    outside = [t.total * b for t in tensors if not t.per_layer]
    return max(sum(per) / max(s.model.num_layers, 1), max(outside, default=0))


def _unsharded_bytes(s: Scenario, tensors: list[ParamTensor]) -> int:
    """Every parameter unsharded, in the dtype FSDP2 all-gathers it (packed quantized linears, else the gathered
    dtype, fsdp_units.gathered_bytes). fully_shard keeps each sharded parameter and makes the unsharded one a separate
    storage (_fsdp_param.py: `_sharded_param_data` vs `init_all_gather_outputs`), so this comes on top of the shards."""
    b = fsdp_units.gathered_bytes(s)
    return int(sum(t.total * (quantized_bytes(s) if t.quantized else b) for t in tensors))


def _root_bytes(s: Scenario, tensors: list[ParamTensor]) -> int:
    """The root group unsharded: what fully_shard on the whole model collects outside the layer units (embedding,
    final norm, an untied head)."""
    return int(sum(t.total * fsdp_units.gathered_bytes(s) for t in tensors if not t.per_layer))


def _loss_after_root(s: Scenario, tensors: list[ParamTensor], ms: ModelStates) -> None:
    """A recipe whose loss runs on the logits the model returned (torchtune, its profile's [model_code.several_devices]
    `loss_after_root_reshard`), the root group its own unit resharded after forward: the root is gathered through
    the model's forward (the output projection its last op), nothing while the loss runs, gathered again at backward's
    start (the flat all-gather buffer and its copy-out both alive) and kept until its post-backward (measured,
    bench/torchtune_distributed.py)."""
    root, layers = _root_bytes(s, tensors), max(s.model.num_layers, 1)
    layer = int(sum(t.total * (quantized_bytes(s) if t.quantized else s.compute_bytes)
                    for t in tensors if t.per_layer) / layers)
    if s.fsdp_strategy == "shard_grad_op":  # nothing is resharded before backward ends
        ms.gathered_loss = ms.gathered_head = ms.gathered_backward_start = ms.gathered_forward
        return
    ms.gathered_forward = ms.gathered_backward = root + 2 * layer  # the running layer + the one prefetched
    ms.gathered_loss, ms.gathered_head = 0, root
    ms.gathered_backward_start = root + layer  # the root back, the last layer prefetched
    ms.regather = 2 * root


def _root_reduce(s: Scenario, trainable: list[ParamTensor]) -> int:
    """The root group (embeddings, final norm, untied head) is reduce-scattered last, from a buffer of its
    whole gradient in the reduce dtype (fp32 under a mixed MixedPrecisionPolicy, else the params' dtype;
    _fsdp_collectives.py::foreach_reduce). The unsharded grads are freed after the copy-in except the
    group's last one, which foreach_reduce's loop variable `unsharded_grad` keeps until it returns: the
    untied head's (measured)."""
    reduce_bytes = 4 if s.precision.endswith("mixed") else s.compute_bytes
    root = sum(t.total for t in trainable if not t.per_layer)
    head = sum(t.total for t in trainable if t.kind == "lm_head")
    return reduce_bytes * root + head * s.compute_bytes


def states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    n = engine_of(s).partition_ranks(s)
    trainable = [t for t in tensors if t.trainable]
    grads = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable)
    optimizer, temps, paged = torch_optimizer(s, trainable)
    frozen = frozen_bytes(s, tensors)
    if shard := fsdp_units.shard_bytes(s):  # a framework that builds the model in fp32 shards it so (LitGPT, bf16-mixed)
        frozen = sum(t.total * (quantized_bytes(s) if t.quantized else shard) for t in tensors if not t.trainable)
    unit = int(_gathered_layer_bytes(s, tensors))  # one decoder layer unsharded
    ms = ModelStates(
        weights=int((frozen + grads) / n),
        gathered_forward=2 * unit,  # the running unit + the one prefetched
        gathered_backward=2 * unit,
        grads_between_steps=grads // n if s.grad_accum > 1 else 0,
        grads_after_backward=grads // n,
        grads_unreduced=layer_elements(s, trainable) * s.compute_bytes,  # one layer's unsharded grads
        last_reduce=_root_reduce(s, trainable),
        optimizer=optimizer // n,
        step_temporaries=temps // n,
        paged_optimizer=paged // n,
    )
    if s.fsdp_strategy == "shard_grad_op":  # every unit stays gathered from its forward to its backward
        ms.gathered_backward = ms.gathered_forward = _unsharded_bytes(s, tensors)
    # only the recipes' own losses run on the returned logits (a fused loss takes the head's weight itself)
    if (model_code(s.profile).get("several_devices", {}).get("loss_after_root_reshard")
            and s.loss in ("chunked_output", "standard")):
        _loss_after_root(s, tensors, ms)
    fsdp_units.apply(s, tensors, ms, n)  # a framework's own wrapping (LitGPT: the root kept, FSDP1 flat units)
    if framework(s.profile).fsdp.get("wrapping") == "accelerate":  # HF Trainer's: accelerate's FSDP1 / FSDP2 layout
        accelerate_fsdp.apply(s, tensors, ms, n)
    if s.steps_in_backward:
        # each parameter is stepped and its gradient freed in its backward hook, after its reduce-scatter (torchtune
        # register_optim_in_bwd_hooks; measured, bench/torchtune_distributed.py): no gradient is left for the step
        ms.grads_after_backward = ms.grads_between_steps = ms.step_temporaries = 0
    if s.runs_autocast:  # fp32 params gathered under autocast (LitGPT lora.py's FSDP2): plain torch's weight casts
        plain.autocast_casts(s, tensors, ms)
        if s.checkpointing != "off":
            ms.recompute_casts = plain.recompute_casts(s, tensors)
    # each rank saves and torch.loads its own shards (sharded state dict): params + optimizer (FINDINGS.md)
    ms.resume_host = ms.weights + ms.optimizer
    if s.fsdp_cpu_offload:
        # one pinned buffer for the shards of all three (the estimate's pinned-rounding unit); counted as
        # optimizer states, the largest of them
        ms.host = [HostBuffer("sharded params + grads + optimizer (FSDP CPU offload)",
                              ms.weights + ms.grads_after_backward + ms.optimizer, "optimizer_states", pinned=True)]
        ms.weights = ms.grads_after_backward = ms.optimizer = ms.step_temporaries = 0
        ms.grads_between_steps = 0
    return ms


def frozen_copy(s: Scenario, tensors: list[ParamTensor], offload: bool) -> tuple[str, int, int, int, list[str]]:
    """A frozen model under FSDP: sharded like the trained one (evaluation mode), two units gathered."""
    phi, lp = sum(t.total for t in tensors), s.compute_bytes
    if s.fsdp_strategy == "no_shard":
        notes = ["reference/reward offload sets offload_param, which only ZeRO-3 honours: ignored here"] if offload else []
        return "full 16-bit replica on every GPU (fsdp)", phi * lp, 0, 0, notes
    unit = sum(t.total for t in tensors if t.per_layer) // max(s.model.num_layers, 1)
    return "FSDP shard (evaluation mode)", -(-phi * lp // s.world_size), 2 * unit * lp, 0, []
