"""Model states per rank: weights, gradients, optimizer states and engine buffers, for each engine.

Sources: ../shared/reference/knobs.md A (DeepSpeed ZeRO 0-3, offload, ratio), B (FSDP), D (LoRA /
QLoRA storage, 8-bit and paged optimizers), F.4 (torch AdamW foreach/fused), H.4 (autocast cache).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.dtypes import BYTES, GPTQ_BYTES_PER_GROUP_OF_128, NF4_DQ_BYTES, NF4_BYTES, pow2_ceil
from memfit.memory.inventory import ParamTensor
from memfit.facts.scenario import Scenario

# DDP allocates flat gradient buckets (gradient_as_bucket_view=False by default): a second copy of
# every gradient (torch/nn/parallel/distributed.py Reducer). Accelerate/HF keep that default.
DDP_BUCKET_COPY = True
# bitsandbytes 8-bit Adam: 1 B per state x 2 states, plus an fp32 absmax per 256-element block each.
ADAM8BIT_BYTES = 2 + 2 * 4 / 256
# DeepSpeed takes gradient norms in fp64 wherever the accelerator has it (CUDA does):
# deepspeed/runtime/zero/utils.py::get_norm_dtype; ZeRO-1/2 offload copies each param's partition slice
# to it in backward (stage_1_and_2.py::set_norm_for_param_grad_in_gpu).
NORM_BYTES = 8


@dataclass
class HostBuffer:
    name: str
    nbytes: int
    pinned: bool = False

    @property
    def resident(self) -> int:
        """Host bytes this buffer holds: pinned memory comes from torch's CachingHostAllocator,
        which rounds every block up to a power of two (aten/src/ATen/cuda/CachingHostAllocator.cpp)."""
        return pow2_ceil(self.nbytes) if self.pinned and self.nbytes else self.nbytes


@dataclass
class ModelStates:
    """Bytes on one rank's GPU by role, plus what that rank keeps in host RAM."""

    weights: int = 0  # resident between steps (partitions, replicas, frozen base, quantized storage)
    gathered_forward: int = 0  # ZeRO-3 / FSDP params gathered while computing (forward)
    gathered_backward: int = 0  # ... and in backward
    autocast_cache: int = 0  # bf16 copies of fp32 weights cached during forward (knobs H.4)
    autocast_cache_head: int = 0  # ... of which the output head's, saved for backward even under checkpointing
    grads_between_steps: int = 0  # gradient storage that exists during forward
    grads_after_backward: int = 0  # all gradient storage at the end of backward
    grads_unreduced: int = 0  # full-size grads of one module waiting for reduce-scatter
    # gradient bytes in flight while the output head's gradient is reduced, right after the head's backward
    # (every activation still saved, the loss buffers gone): ZeRO-1/2 offload
    head_reduce: int = 0
    # ... while the last gradient of backward is reduced, after every layer's activations and gathered
    # params are gone (ZeRO-1/2 offload: the first param's; FSDP2: the root group's)
    last_reduce: int = 0
    optimizer: int = 0
    step_grads: int = 0  # extra gradient copies made inside optimizer.step (fp32 flatten/upcast)
    step_temporaries: int = 0  # optimizer math temporaries (foreach lists, sub-group scratch)
    engine_buffers: int = 0  # reduce buckets, DDP buckets, offload staging (whole step)
    backward_buffers: int = 0  # buffers that exist only while backward reduces (ZeRO-1/2 IPG buckets)
    load_transient: int = 0  # extra device bytes while the engine initializes (flatten copies, scratch)
    resume_host: int = 0  # extra host bytes per rank while a checkpoint loads
    paged_optimizer: int = 0  # cudaMallocManaged states: outside torch's counters, on the device
    host: list[HostBuffer] = field(default_factory=list)  # per rank
    notes: list[str] = field(default_factory=list)

    @property
    def host_bytes(self) -> int:
        return sum(b.resident for b in self.host)


def _sum(tensors, pred=lambda t: True) -> int:
    return sum(t.total for t in tensors if pred(t))


def _quantized_bytes(s: Scenario) -> float:
    if s.model.quantization == "gptq-int4":
        return GPTQ_BYTES_PER_GROUP_OF_128
    return NF4_DQ_BYTES if s.double_quant else NF4_BYTES


def _frozen_bytes(s: Scenario, tensors: list[ParamTensor]) -> float:
    """Bytes of frozen weights: 4-bit storage for quantized linears, compute dtype for the rest."""
    frozen_dtype = 4 if s.precision == "fp32" or s.kbit_upcast and s.tuning == "qlora" else s.compute_bytes
    return sum(t.total * (_quantized_bytes(s) if t.quantized else frozen_dtype) for t in tensors if not t.trainable)


def _gathered_layer_bytes(s: Scenario, tensors: list[ParamTensor]) -> float:
    """Bytes of one gathered FSDP unit: quantized linears travel packed (bnb quant_storage / GPTQ qweight),
    the rest in the compute dtype."""
    per = [t.total * (_quantized_bytes(s) if t.quantized else s.compute_bytes) for t in tensors if t.per_layer]
    outside = [t.total * s.compute_bytes for t in tensors if not t.per_layer]
    return max(sum(per) / max(s.model.num_layers, 1), max(outside, default=0))


def trainable_dtype_bytes(s: Scenario, t: ParamTensor) -> int:
    """dtype of a trainable tensor as it lives in the module (outside DeepSpeed)."""
    if t.kind == "lora":
        return s.adapter_bytes
    return 2 if s.precision.endswith("pure") else 4


def _adam_state_bytes(s: Scenario, param_bytes: int) -> float:
    return {
        "adamw-foreach": 2 * param_bytes,
        "adamw-fused": 2 * param_bytes,
        "adamw-loop": 2 * param_bytes,
        "adamw-8bit": ADAM8BIT_BYTES,
        "paged-adamw-8bit": ADAM8BIT_BYTES,
        "paged-adamw-32bit": 8,
        "sgd": 0,
        "adafactor": 0,
    }[s.optimizer]


def _adafactor_bytes(trainable: list[ParamTensor], param_bytes: int) -> int:
    """Adafactor keeps factored row and column second moments for matrices, full ones for vectors."""
    total = 0
    for t in trainable:
        width = t.in_features + t.out_features if t.in_features and t.out_features else t.numel
        total += width * t.count * param_bytes
    return total


def _torch_optimizer(s: Scenario, trainable: list[ParamTensor]) -> tuple[int, int, int]:
    """(states, step temporaries, paged states) of a torch/bitsandbytes optimizer over the given tensors."""
    states = temps = paged = 0
    for t in trainable:
        pb = trainable_dtype_bytes(s, t)
        st = int(t.total * _adam_state_bytes(s, pb))
        if s.optimizer.startswith("paged"):
            paged += st
        else:
            states += st
        if s.optimizer == "adamw-foreach":
            temps += t.total * pb  # torch._foreach_sqrt(exp_avg_sqs): one state-sized list at once
    if s.optimizer == "adafactor":
        states = _adafactor_bytes(trainable, 4)
    if s.optimizer == "adamw-loop" and trainable:
        temps = max(t.numel * trainable_dtype_bytes(s, t) for t in trainable)
    return states, temps, paged


def _fp32_under_autocast(s: Scenario, t: ParamTensor) -> bool:
    if t.kind not in ("linear", "lm_head", "lora") or t.quantized:
        return False
    if t.trainable:
        return trainable_dtype_bytes(s, t) == 4
    return s.tuning == "qlora" and s.kbit_upcast and t.kind == "lm_head"  # PEFT's kbit upcast


def plain_states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    """Single GPU or DDP: every rank holds all weights, grads and optimizer states."""
    trainable = [t for t in tensors if t.trainable]
    grads = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable)
    states, temps, paged = _torch_optimizer(s, trainable)
    ms = ModelStates(
        weights=int(_frozen_bytes(s, tensors)) + grads,  # trainable weights have the grads' dtype
        grads_between_steps=grads if s.grad_accum > 1 else 0,
        grads_after_backward=grads,
        optimizer=states,
        step_temporaries=temps,
        paged_optimizer=paged,
    )
    if s.runs_autocast:
        # autocast casts each fp32 weight a matmul reads to 16 bit; the copies are cached through forward and
        # saved for backward by the matmuls whose input needs a gradient (aten autocast_mode.cpp)
        copies = [t for t in tensors if _fp32_under_autocast(s, t)]
        ms.autocast_cache = sum(t.total * s.compute_bytes for t in copies)
        ms.autocast_cache_head = sum(t.total * s.compute_bytes for t in copies if t.kind == "lm_head")
    if s.model.tie_embeddings:
        # the tied embedding's backward makes a fresh dense gradient and adds it into the head's
        ms.grads_unreduced = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable if t.kind == "embedding")
    if s.optimizer_in_backward:
        # the step runs inside backward per parameter, so only one gradient exists at a time
        largest = max((t.numel * trainable_dtype_bytes(s, t) for t in trainable), default=0)
        ms.grads_after_backward = ms.grads_between_steps = largest
        ms.step_temporaries = min(ms.step_temporaries, largest)
    if s.engine == "ddp" and s.world_size > 1 and DDP_BUCKET_COPY:
        ms.engine_buffers = grads
        ms.notes.append("DDP keeps flat gradient buckets beside param.grad (gradient_as_bucket_view=False)")
    return ms


def _largest_module(tensors: list[ParamTensor]) -> int:
    return max((t.numel for t in tensors), default=0)


def fsdp_states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    """FSDP: params, grads and optimizer states sharded over ranks (FULL_SHARD), one unit gathered."""
    n = s.world_size if s.fsdp.strategy != "hybrid_shard" else s.hardware.gpus_per_node
    trainable = [t for t in tensors if t.trainable]
    grads = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable)
    states, temps, paged = _torch_optimizer(s, trainable)
    frozen = _frozen_bytes(s, tensors)
    unit = int(_gathered_layer_bytes(s, tensors))  # one decoder layer unsharded
    ms = ModelStates(
        weights=int((frozen + grads) / n),
        gathered_forward=2 * unit,  # the running unit + the one prefetched
        gathered_backward=2 * unit,
        grads_between_steps=grads // n if s.grad_accum > 1 else 0,
        grads_after_backward=grads // n,
        grads_unreduced=_layer_bytes(s, trainable) * s.compute_bytes,  # one layer's unsharded grads
        last_reduce=_fsdp_root_reduce(s, trainable),
        optimizer=states // n,
        step_temporaries=temps // n,
        paged_optimizer=paged // n,
    )
    if s.fsdp.strategy == "shard_grad_op":
        ms.gathered_backward = ms.gathered_forward = int(frozen + grads) - ms.weights
    # each rank saves and torch.loads its own shards (sharded state dict): params + optimizer (FINDINGS.md)
    ms.resume_host = ms.weights + ms.optimizer
    if s.fsdp.cpu_offload:
        ms.host = [HostBuffer("sharded params + grads + optimizer (FSDP CPU offload)",
                              ms.weights + ms.grads_after_backward + ms.optimizer, pinned=True)]
        ms.weights = ms.grads_after_backward = ms.optimizer = ms.step_temporaries = 0
        ms.grads_between_steps = 0
    return ms


def _fsdp_root_reduce(s: Scenario, trainable: list[ParamTensor]) -> int:
    """The root group (embeddings, final norm, untied head) is reduce-scattered last, from a buffer of its
    whole gradient in the reduce dtype (fp32 under a mixed MixedPrecisionPolicy, else the params' dtype;
    _fsdp_collectives.py::foreach_reduce). The unsharded grads are freed after the copy-in except the
    group's last one, which foreach_reduce's loop variable `unsharded_grad` keeps until it returns: the
    untied head's (measured)."""
    reduce_bytes = 4 if s.precision.endswith("mixed") else s.compute_bytes
    root = sum(t.total for t in trainable if not t.per_layer)
    head = sum(t.total for t in trainable if t.kind == "lm_head")
    return reduce_bytes * root + head * s.compute_bytes


def _layer_bytes(s: Scenario, tensors: list[ParamTensor]) -> int:
    """Elements of one decoder layer (the FSDP / ZeRO-3 gather unit)."""
    layers = max(s.model.num_layers, 1)
    per_layer = sum(t.total for t in tensors if t.per_layer) // layers
    return max(per_layer, _largest_module([t for t in tensors if not t.per_layer]))


def _zero3_retained(s: Scenario, tensors: list[ParamTensor], max_reuse: int) -> int:
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


def deepspeed_states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    """DeepSpeed 0.19 buffers, as measured on the real engine (memfit/measure/FINDINGS.md, knobs.md A)."""
    ds = s.deepspeed
    n = s.world_size
    psi = _sum(tensors, lambda t: t.trainable)  # trainable elements
    lp = 4 if s.precision == "fp32" else 2  # DeepSpeed casts the module to bf16/fp16 (engine.py)
    frozen = _frozen_bytes(s, tensors)
    accum = BYTES[ds.grad_accum_dtype] if ds.grad_accum_dtype else lp
    part = -(-psi // n)
    if ds.stage == 0:
        ms = _zero0_states(s, psi, frozen, lp, tensors)
    elif ds.stage in (1, 2):
        ms = _zero12_states(s, tensors, psi, part, frozen, lp, accum)
    else:
        gpu_share = _ratio_gpu_share(s, tensors) if ds.offload_optimizer != "none" else 1.0
        ms = _zero3_states(s, tensors, psi, frozen, lp, accum, gpu_share)
    adam_on_host = sum(b.nbytes for b in ms.host if "Adam" in b.name)
    # the optimizer file (fp32 master + m + v, torch.load without mmap); ZeRO-3 with offload saves only
    # CPUAdam's m, v: the sub-groups `ratio` keeps on the GPU are stepped by a backup AdamW whose state is
    # never saved (stage3.py::_rigid_state_dict)
    shard = psi if ds.stage == 0 else part
    adam_file = adam_on_host if ds.stage == 3 and ds.offload_optimizer != "none" else 8 * shard
    optimizer_file = 4 * shard + adam_file
    module_file = (2 * _sum(tensors) if ds.stage < 3 else 0)  # loaded and released before the optimizer file
    # ZeRO-2/3 checkpoints also carry the frozen params (`frozen_param_fragments`: whole under ZeRO-2, this
    # rank's partitions under ZeRO-3); _load_checkpoint hands them back in client_state, so they stay loaded
    # beside the optimizer file (engine.py::_load_checkpoint, _get_param_fragment_func). Under ZeRO-2 they
    # share the module file's storages in a CPU run (measured); a GPU run writes them twice (FINDINGS.md).
    fragments = (int(frozen) if ds.stage == 2 else int(frozen / n) if ds.stage == 3 else 0)
    # with offload the loaded m, v become CPUAdam's state without a copy (FINDINGS.md, resume)
    ms.resume_host = max(module_file, fragments + optimizer_file - adam_on_host + (module_file if ds.stage == 0 else 0))
    ms.notes.append(f"DeepSpeed ZeRO-{ds.stage}: reduce bucket {ds.reduce_bucket_size:,} elements, "
                    f"overlap_comm {ds.overlap}")
    return ms


def _zero0_states(s, psi, frozen, lp, tensors) -> ModelStates:
    """bf16 ZeRO-0 runs FP16_Optimizer: full fp32 master and Adam on every GPU."""
    return ModelStates(
        weights=int(frozen) + psi * lp,
        grads_after_backward=psi * lp,
        grads_unreduced=psi * lp if s.world_size > 1 else 0,  # buffered_allreduce_fallback flattens the grads
        optimizer=12 * psi,
        step_grads=8 * psi,  # per-param grad.to(fp32) list + the flattened fp32 grads
        load_transient=4 * psi,  # Adam states come from a dummy step on zero fp32 grads at init
    )


def _zero12_states(s, tensors, psi, part, frozen, lp, accum) -> ModelStates:
    ds = s.deepspeed
    offload = ds.offload_optimizer != "none"
    trainable = [t for t in tensors if t.trainable]
    largest = _largest_module(trainable)
    ms = ModelStates(weights=int(frozen) + psi * lp)  # bit16_groups_flat is whole on every rank
    # grads_in_partition lives from the first reduction to the end of the step (and across micro-steps);
    # ZeRO-1 also holds each param's full bf16 grad until its bucket is reduced
    ms.grads_after_backward = part * accum
    if ds.stage == 1:  # the full bf16 param.grad lives until its bucket is reduced
        ms.grads_unreduced = (psi - part) * accum
    ms.grads_between_steps = part * accum if s.grad_accum > 1 else 0
    if ds.contiguous_gradients or offload:
        ms.backward_buffers = ds.reduce_bucket_size * lp * (2 if ds.overlap else 1) + min(
            ds.reduce_bucket_size, psi) * lp  # buckets + flatten of the bucket being reduced
    # flatten beside the module's params; then the fp32 master and a zero grad partition (on the host if offloaded)
    ms.load_transient = psi * lp if offload else max(psi * lp, 8 * part)
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
    order = _partition_order(s, trainable)
    first = order[0] if order else 0
    head = sum(t.numel for t in trainable if t.kind == "lm_head")
    def in_flight(numel: int) -> int:
        return numel * lp + NORM_BYTES * min(numel, part)

    ms.grads_unreduced = (psi - first) * accum if ds.stage == 1 else 0
    ms.last_reduce = ms.grads_unreduced + in_flight(first)
    ms.head_reduce = in_flight(head) if (ds.stage == 2 or ds.overlap) else 0
    ms.host = _offload_host_stage12(s, part, largest, lp)
    return ms


def _ratio_gpu_share(s: Scenario, tensors: list[ParamTensor]) -> float:
    """Fraction of the optimizer partition that stays on the GPU under `ratio` (ZeRO-3 only): the first
    int((1 - ratio) * S) of the S sub-groups, which stage3.py cuts at parameter boundaries once a group
    holds sub_group_size partition elements (_create_fp16_sub_groups, _create_fp32_partitions)."""
    ds = s.deepspeed
    n = s.world_size
    groups, current = [], 0
    for numel in _partition_order(s, [t for t in tensors if t.trainable]):
        current += -(-numel // n)
        if current >= ds.sub_group_size:
            groups.append(current)
            current = 0
    if current:
        groups.append(current)
    on_gpu = int((1 - ds.ratio) * len(groups))
    return sum(groups[:on_gpu]) / max(sum(groups), 1)


def _partition_order(s: Scenario, tensors: list[ParamTensor]) -> list[int]:
    """Parameter sizes in module order: embeddings, each decoder layer's tensors, then the rest."""
    head = [t.numel for t in tensors if not t.per_layer and t.kind == "embedding" for _ in range(t.count)]
    layers = max(s.model.num_layers, 1)
    per_layer = [t for t in tensors if t.per_layer]
    body = [t.numel for _ in range(layers) for t in per_layer for _ in range(max(1, t.count // layers))]
    tail = [t.numel for t in tensors if not t.per_layer and t.kind != "embedding" for _ in range(t.count)]
    return head + body + tail


def _zero3_states(s, tensors, psi, frozen, lp, accum, gpu_share) -> ModelStates:
    ds = s.deepspeed
    n = s.world_size
    part = -(-psi // n)
    persistent = _sum(tensors, lambda t: t.numel < ds.param_persistence_threshold)
    prefetch = min(ds.prefetch_bucket_size, ds.max_live_parameters)
    retained = _zero3_retained(s, tensors, 1_000_000_000)
    working = retained + prefetch
    block = _moe_block_elements(tensors)
    if block and retained < _zero3_retained(s, tensors, 2**62):  # some layer (and its block) is released
        # a MoE block not retained is fetched whole (a leaf module; in transformers 5 the experts are stacked
        # params anyway) and waited on before the next modules are prefetched: it adds to the working set
        working += block
    ms = ModelStates()
    ms.weights = int((frozen + psi * lp) / n) + persistent * lp
    ms.gathered_forward = ms.gathered_backward = working * lp
    ms.load_transient = 2 * part * lp  # defragment copies every partition into lp_param_buffer
    ms.grads_unreduced = _largest_module([t for t in tensors if t.trainable]) * lp
    ms.engine_buffers = ds.reduce_bucket_size * lp  # one IPG buffer in stage 3
    sub = min(ds.sub_group_size, part)
    if ds.offload_param != "none":
        ms.host.append(HostBuffer("bf16 param partitions (offload_param, always pinned)", int((frozen + psi * lp) / n),
                                  True))
        ms.weights = persistent * lp
    if ds.offload_optimizer == "none":
        ms.grads_between_steps = ms.grads_after_backward = part * accum
        ms.optimizer = 12 * part
        ms.load_transient += sub * 4  # fp32 gradient scratch of the largest sub-group, freed after init
        # flatten + .to(fp32) per sub-group, beside get_grad_norm_direct's fp32 copy of the largest partition
        ms.step_temporaries = 6 * sub + 4 * -(-_largest_module([t for t in tensors if t.trainable]) // n)
        return ms
    gpu_part = int(part * gpu_share)
    host_part = part - gpu_part
    ms.optimizer = 16 * gpu_part  # master + m + v + fp32 grad of the GPU-resident sub-groups
    ms.step_temporaries = 6 * min(sub, gpu_part) if gpu_part else 0
    ms.host += [
        HostBuffer("grad partition buffer (stage3 grad_partitions_flat_buffer)", part * accum, ds.pin_memory),
        HostBuffer("fp32 master weights (offloaded sub-groups)", 4 * host_part, False),
        HostBuffer("fp32 gradients (offloaded sub-groups)", 4 * host_part, ds.pin_memory),
        HostBuffer("Adam m + v (DeepSpeedCPUAdam)", 8 * host_part, False),
    ]
    if ds.pin_memory:
        ms.host = _split_by_subgroup(ms.host, sub)
    return ms


def _split_by_subgroup(buffers: list[HostBuffer], sub: int) -> list[HostBuffer]:
    """Pinned fp32 buffers are allocated per sub-group; each rounds up to a power of two on its own."""
    out = []
    for b in buffers:
        unit = sub * 4 if "fp32 grad" in b.name else b.nbytes
        if not b.pinned or unit <= 0 or b.nbytes <= unit:
            out.append(b)
            continue
        full, rest = divmod(b.nbytes, unit)
        out += [HostBuffer(b.name, unit, True) for _ in range(full)]
        if rest:
            out.append(HostBuffer(b.name, rest, True))
    return out


def _offload_host_stage12(s: Scenario, part: int, largest: int, lp: int) -> list[HostBuffer]:
    pin = s.deepspeed.pin_memory
    bufs = [
        HostBuffer("fp32 master weights partition", 4 * part, pin),
        HostBuffer("fp32 gradient partition", 4 * part, pin),
        HostBuffer("Adam m + v (DeepSpeedCPUAdam)", 8 * part, False),
        HostBuffer("bf16 staging copy of the partition", part * lp, pin),
        HostBuffer("temp_grad_buffer_for_cpu_offload", largest * lp, pin),
    ]
    if s.grad_accum > 1:
        bufs.append(HostBuffer("accumulated_grads_in_cpu", part * lp, pin))
    return bufs


def model_states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    if s.engine == "deepspeed":
        return deepspeed_states(s, tensors)
    if s.engine == "fsdp":
        return fsdp_states(s, tensors)
    return plain_states(s, tensors)
