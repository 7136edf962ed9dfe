"""DeepSpeed 0.19 buffers per rank, as measured on the real engine (memfit/measure/FINDINGS.md, docs/knobs.md A)."""
from __future__ import annotations

from memfit.dtypes import BYTES
from memfit.facts.engines import engine_of
from memfit.facts.engines.deepspeed import overlap
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import ParamTensor
from memfit.memory.states.common import (HostBuffer, ModelStates, frozen_bytes, largest_module, partition_order,
                                         partition_sizes, total)

# DeepSpeed takes gradient norms in fp64 wherever the accelerator has it (CUDA does):
# deepspeed/runtime/zero/utils.py::get_norm_dtype; ZeRO-1/2 offload copies each param's partition slice
# to it in backward (stage_1_and_2.py::set_norm_for_param_grad_in_gpu).
NORM_BYTES = 8
ADAM_MOMENTS = "Adam m + v (DeepSpeedCPUAdam)"


def states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    assert s.zero_stage is not None, "a DeepSpeed run has its ZeRO stage (Scenario's rules)"
    n = s.world_size
    psi = total(tensors, lambda t: t.trainable)  # trainable elements
    lp = 4 if s.precision == "fp32" else 2  # DeepSpeed casts the module to bf16/fp16 (engine.py)
    frozen = frozen_bytes(s, tensors)
    accum = BYTES[s.grad_accum_dtype] if s.grad_accum_dtype else lp
    part = -(-psi // n)
    if s.zero_stage == 0:
        ms = _zero0(s, psi, frozen, lp)
    elif s.zero_stage in (1, 2):
        ms = _zero12(s, tensors, psi, part, frozen, lp, accum)
    else:
        ms = _zero3(s, tensors, psi, frozen, lp, accum)
    adam_on_host = sum(b.nbytes for b in ms.host if b.name == ADAM_MOMENTS)
    # the optimizer file (fp32 master + m + v, torch.load without mmap); ZeRO-3 with offload saves only
    # CPUAdam's m, v: the sub-groups `ratio` keeps on the GPU are stepped by a backup AdamW whose state is
    # never saved (stage3.py::_rigid_state_dict)
    shard = psi if s.zero_stage == 0 else part
    adam_file = adam_on_host if s.zero_stage == 3 and s.offload_optimizer != "none" else 8 * shard
    optimizer_file = 4 * shard + adam_file
    module_file = (2 * total(tensors) if s.zero_stage < 3 else 0)  # loaded and released before the optimizer file
    # ZeRO-2/3 checkpoints also carry the frozen params (`frozen_param_fragments`: whole under ZeRO-2, this
    # rank's partitions under ZeRO-3); _load_checkpoint hands them back in client_state, so they stay loaded
    # beside the optimizer file (engine.py::_load_checkpoint, _get_param_fragment_func). Under ZeRO-2 they
    # share the module file's storages in a CPU run (measured); a GPU run writes them twice (FINDINGS.md).
    fragments = (int(frozen) if s.zero_stage == 2 else int(frozen / n) if s.zero_stage == 3 else 0)
    # with offload the loaded m, v become CPUAdam's state without a copy (FINDINGS.md, resume)
    ms.resume_host = max(module_file,
                         fragments + optimizer_file - adam_on_host + (module_file if s.zero_stage == 0 else 0))
    ms.notes.append(f"DeepSpeed ZeRO-{s.zero_stage}: reduce bucket {s.reduce_bucket_size:,} elements, "
                    f"overlap_comm {overlap(s)}")
    return ms


def _zero0(s: Scenario, psi, frozen, lp) -> ModelStates:
    """bf16 ZeRO-0 runs FP16_Optimizer: full fp32 master and Adam on every GPU."""
    return ModelStates(
        weights=int(frozen) + psi * lp,
        grads_after_backward=psi * lp,
        grads_unreduced=psi * lp if s.world_size > 1 else 0,  # buffered_allreduce_fallback flattens the grads
        optimizer=12 * psi,
        step_grads=8 * psi,  # per-param grad.to(fp32) list + the flattened fp32 grads
        # Adam's states come from a dummy step on zero fp32 grads at init (fused_optimizer.py; measured 18 x psi)
        load_moments=[{"weights": int(frozen) + psi * lp, "optimizer_states": 12 * psi, "gradients": 4 * psi}],
    )


def _zero12(s: Scenario, tensors, psi, part, frozen, lp, accum) -> ModelStates:
    offload = s.offload_optimizer != "none"
    trainable = [t for t in tensors if t.trainable]
    largest = largest_module(trainable)
    ms = ModelStates(weights=int(frozen) + psi * lp)  # bit16_groups_flat is whole on every rank
    # grads_in_partition lives from the first reduction to the end of the step (and across micro-steps);
    # ZeRO-1 also holds each param's full bf16 grad until its bucket is reduced
    ms.grads_after_backward = part * accum
    if s.zero_stage == 1:  # the full bf16 param.grad lives until its bucket is reduced
        ms.grads_unreduced = (psi - part) * accum
    ms.grads_between_steps = part * accum if s.grad_accum > 1 else 0
    if s.contiguous_gradients or offload:
        ms.backward_buffers = s.reduce_bucket_size * lp * (2 if overlap(s) else 1) + min(
            s.reduce_bucket_size, psi) * lp  # buckets + flatten of the bucket being reduced
    ms.load_moments = _init_moments_zero12(s, ms.weights, psi * lp, part, offload)
    if not offload:
        ms.optimizer = 12 * part
        ms.step_grads = 6 * part  # flatten (accum dtype) then .to(fp32) of the partition
        return ms
    ms.engine_buffers = largest * lp  # temp_grad_buffer_for_gpu_offload
    ms.grads_between_steps = 0
    ms.grads_after_backward = 0
    # A param's gradient on its way to the host: the gradient itself (an oversized one is cloned out of
    # autograd's buffer, reduce_independent_p_g_buckets_and_remove_grads) and the fp64 copy of its partition
    # slice that set_norm_for_param_grad_in_gpu takes the norm of. The head's goes first, with every
    # activation still saved (ZeRO-2, or ZeRO-1 with overlap_comm: reductions run in backward); the first
    # param's (the embedding) goes last, after every layer. ZeRO-1 keeps every full gradient until the step.
    order = partition_order(s, trainable)
    first = order[0] if order else 0
    head = sum(t.numel for t in trainable if t.kind == "lm_head")

    def in_flight(numel: int) -> int:
        return numel * lp + NORM_BYTES * min(numel, part)

    ms.grads_unreduced = (psi - first) * accum if s.zero_stage == 1 else 0
    ms.last_reduce = ms.grads_unreduced + in_flight(first)
    ms.head_reduce = in_flight(head) if (s.zero_stage == 2 or overlap(s)) else 0
    ms.host = _offload_host_stage12(s, part, largest, lp)
    return ms


def ratio_gpu_share(s: Scenario, tensors: list[ParamTensor]) -> float:
    """Share of the optimizer partition that stays on the GPU under `ratio` (ZeRO-3 with optimizer offload),
    from the real sub-groups of this model's partition."""
    return engine_of(s).optimizer_gpu_share(s, partition_sizes(s, tensors))


def zero3_retained(s: Scenario, tensors: list[ParamTensor], max_reuse: int) -> int:
    """Elements DeepSpeed keeps gathered from forward into backward: a module's params are not released
    when its next use in the fetch trace (its backward) comes within max_reuse_distance elements
    (partitioned_param_coordinator.py). A frozen embedding is never fetched in backward, so it goes."""
    layers = s.model.num_layers
    layer = sum(t.total for t in tensors if t.per_layer) // max(layers, 1)
    embed = sum(t.total for t in tensors if t.kind == "embedding")
    head = sum(t.total for t in tensors if t.kind == "lm_head")
    embed_trains = any(t.trainable for t in tensors if t.kind == "embedding")
    if s.model.tie_embeddings:  # the head's weight is the embedding: gathered by the head, kept for its backward
        head, embed_trains = embed, False
    retained, after = head, head  # the head is used again right away by its own backward
    for _ in range(layers):
        if 2 * after + layer > max_reuse:
            return retained
        retained += layer
        after += layer
    if embed_trains and 2 * after + embed <= max_reuse:
        retained += embed
    return retained


def _moe_block_elements(tensors: list[ParamTensor]) -> int:
    """Elements of one sparse MoE block (router + every routed expert + shared experts): the ZeRO-3 fetch unit
    when the block is a leaf module (deepspeed.utils.set_z3_leaf_modules, as LLaMA-Factory's
    add_z3_leaf_module sets it): fetch_sub_module gathers iter_params(block, recurse=True) at once and
    release_sub_module frees them together (partitioned_param_coordinator.py). 0 for a dense model."""
    routers = [t for t in tensors if t.kind == "router" and t.module == "gate"]
    if not routers:
        return 0
    blocks = sum(t.count for t in routers)
    moe = [t for t in tensors if t.kind == "router" or ".experts." in t.name or ".shared_expert" in t.name]
    return sum(t.total for t in moe) // max(blocks, 1)


def _zero3(s: Scenario, tensors, psi, frozen, lp, accum) -> ModelStates:
    n = s.world_size
    part = -(-psi // n)
    persistent = total(tensors, lambda t: t.numel < s.param_persistence_threshold)
    prefetch = min(s.prefetch_bucket_size, s.max_live_parameters)
    retained = zero3_retained(s, tensors, 1_000_000_000)
    working = retained + prefetch
    block = _moe_block_elements(tensors)
    if block and retained < zero3_retained(s, tensors, 2**62):  # some layer (and its block) is released
        # a MoE block not retained is fetched whole (a leaf module; in transformers 5 the experts are stacked
        # params anyway) and waited on before the next modules are prefetched: it adds to the working set
        working += block
    largest = largest_module([t for t in tensors if t.trainable])
    biggest = largest_module(tensors) * lp  # the param made (or gathered) whole at init
    model = int(frozen + psi * lp)
    ms = ModelStates()
    ms.weights = int((frozen + psi * lp) / n) + persistent * lp
    ms.gathered_forward = ms.gathered_backward = working * lp
    ms.grads_unreduced = largest * lp
    ms.engine_buffers = s.reduce_bucket_size * lp  # one IPG buffer in stage 3
    sub = min(s.sub_group_size, part)
    if s.offload_param != "none":
        ms.host.append(HostBuffer("bf16 param partitions (offload_param, always pinned)", int((frozen + psi * lp) / n),
                                  "weights", pinned=True))
        ms.weights = persistent * lp
    if s.offload_optimizer == "none":
        ms.grads_between_steps = ms.grads_after_backward = part * accum
        ms.optimizer = 12 * part
        ms.load_moments = _init_moments_zero3(s, ms.weights, model, biggest, part * lp, part, 4 * sub)
        # flatten + .to(fp32) per sub-group, beside get_grad_norm_direct's fp32 copy of the largest partition
        ms.step_temporaries = 6 * sub + 4 * -(-largest // n)
        return ms
    gpu_part = int(part * ratio_gpu_share(s, tensors))
    host_part = part - gpu_part
    ms.optimizer = 16 * gpu_part  # master + m + v + fp32 grad of the GPU-resident sub-groups
    ms.load_moments = _init_moments_zero3(s, ms.weights, model, biggest, part * lp, gpu_part, 4 * gpu_part)
    ms.step_temporaries = 6 * min(sub, gpu_part) if gpu_part else 0
    pin = s.pin_memory
    ms.host += [
        HostBuffer("grad partition buffer (stage3 grad_partitions_flat_buffer)", part * accum, "gradients", pin),
        HostBuffer("fp32 master weights (offloaded sub-groups)", 4 * host_part, "optimizer_states"),
        # allocated per sub-group: each pinned piece rounds up to a power of two on its own
        HostBuffer("fp32 gradients (offloaded sub-groups)", 4 * host_part, "gradients", pin, chunk=sub * 4),
        HostBuffer(ADAM_MOMENTS, 8 * host_part, "optimizer_states"),
    ]
    return ms


def _init_moments_zero12(s: Scenario, weights: int, flat: int, part: int, offload: bool) -> list[dict[str, int]]:
    """The device at DeepSpeedZeroOptimizer's initialization: the bf16 flat copy beside the module's own params
    (freed into views of it), then the fp32 master and a zero fp32 grad partition (initialize_optimizer_states);
    offloaded, both are host buffers. Adam's m, v exist then only under DeepSpeed < 0.13.2, which stepped once."""
    flatten = {"weights": weights, "engine_buffers": flat}
    if offload:
        return [flatten]
    adam = 8 * part if s.optimizer_init_step else 0
    return [flatten, {"weights": weights, "optimizer_states": 4 * part + adam, "gradients": 4 * part}]


def _init_moments_zero3(s: Scenario, weights: int, model: int, largest: int, flat: int, gpu_part: int,
                        grads: int) -> list[dict[str, int]]:
    """The device while ZeRO-3 builds and initializes (0.19.8):
    - building: zero.Init makes each param whole on the device and cuts this rank's partition from it
      (partition_parameters.py); one param is whole at a time, the largest last, and one is all-gathered whole once
      at init. Without zero.Init the engine moves the whole 16-bit module to the device first (engine.py
      _configure_distributed_model: not a zero-init model);
    - defragment copies the partitions into lp_param_buffer on the device (with offload_param into a pinned host
      buffer instead: nothing on the device; stage3.py _create_fp16_partitions_with_defragmentation);
    - each GPU sub-group's fp32 master beside `grads` (initialize_optimizer_states: one fp32 scratch of the largest
      sub-group, freed at its end; with optimizer offload each sub-group kept on the GPU gets its own fp32 grad
      buffer there). Under DeepSpeed < 0.13.2 a step per sub-group made Adam's m, v there too.
    The IPG bucket is made after these."""
    build = {"weights": weights, "engine_buffers": largest} if s.zero3_init else {"weights": model}
    moments = [build, {"weights": weights, "engine_buffers": flat if s.offload_param == "none" else 0}]
    if gpu_part:
        adam = 8 * gpu_part if s.optimizer_init_step else 0
        moments.append({"weights": weights, "optimizer_states": 4 * gpu_part + adam, "gradients": grads})
    return moments


def _offload_host_stage12(s: Scenario, part: int, largest: int, lp: int) -> list[HostBuffer]:
    pin = s.pin_memory
    bufs = [
        HostBuffer("fp32 master weights partition", 4 * part, "optimizer_states", pin),
        HostBuffer("fp32 gradient partition", 4 * part, "gradients", pin),
        HostBuffer(ADAM_MOMENTS, 8 * part, "optimizer_states"),
        HostBuffer("bf16 staging copy of the partition", part * lp, "engine_buffers", pin),
        HostBuffer("temp_grad_buffer_for_cpu_offload", largest * lp, "gradients", pin),
    ]
    if s.grad_accum > 1:
        bufs.append(HostBuffer("accumulated_grads_in_cpu", part * lp, "gradients", pin))
    return bufs


def frozen_copy(s: Scenario, tensors: list[ParamTensor], offload: bool) -> tuple[str, int, int, int, list[str]]:
    """A frozen model as OpenRLHF's get_eval_ds_config places it: a ZeRO-3 inference engine sharded like the
    policy (its params offloaded with --ref_offload), or a stage-0 replica under stages 0-2."""
    lp = s.compute_bytes
    phi = sum(t.total for t in tensors)
    if s.zero_stage != 3:
        notes = ["reference/reward offload sets offload_param, which only ZeRO-3 honours: ignored here"] if offload else []
        return "full 16-bit replica on every GPU (DeepSpeed stage 0)", phi * lp, 0, 0, notes
    persistent = sum(t.total for t in tensors if t.numel < s.param_persistence_threshold) * lp
    gathered = (max(t.numel for t in tensors) + min(s.prefetch_bucket_size, s.max_live_parameters)) * lp
    part = -(-phi * lp // s.world_size)
    if offload:
        return "DeepSpeed ZeRO-3 inference engine, params offloaded to CPU", persistent, gathered, part, []
    return "DeepSpeed ZeRO-3 inference engine (sharded like the policy)", part + persistent, gathered, 0, []
