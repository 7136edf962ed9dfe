"""What every engine's byte model shares: the per-rank record of model states, host buffers, and the
bytes of weights, gradients and torch optimizers (docs/knobs.md D: LoRA / QLoRA storage, 8-bit and paged
optimizers; F.4: torch AdamW foreach / fused; H.4: the autocast weight cache).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.dtypes import FP8_BLOCK_BYTES, GPTQ_BYTES_PER_GROUP_OF_128, NF4_BYTES, NF4_DQ_BYTES, int8_bytes, pow2_ceil
from memfit.memory.inventory import ParamTensor
from memfit.facts.scenario import Scenario

# bitsandbytes 8-bit Adam: 1 B per state x 2 states, plus an fp32 absmax per 256-element block each.
ADAM8BIT_BYTES = 2 + 2 * 4 / 256


@dataclass
class HostBuffer:
    """A buffer one rank keeps in host RAM, with the memory category it counts under."""

    name: str
    nbytes: int
    category: str  # weights | gradients | optimizer_states | engine_buffers (memfit/breakdown.py)
    pinned: bool = False
    chunk: int = 0  # allocated in pieces of this many bytes, each rounded on its own (0: one piece)

    @property
    def resident(self) -> int:
        """Host bytes this buffer holds: pinned memory comes from torch's CachingHostAllocator, which rounds
        every block up to a power of two (aten/src/ATen/cuda/CachingHostAllocator.cpp)."""
        if not self.pinned or not self.nbytes:
            return self.nbytes
        if not self.chunk or self.nbytes <= self.chunk:
            return pow2_ceil(self.nbytes)
        full, rest = divmod(self.nbytes, self.chunk)
        return full * pow2_ceil(self.chunk) + (pow2_ceil(rest) if rest else 0)


@dataclass
class ModelStates:
    """Bytes on one rank's GPU by role, plus what that rank keeps in host RAM."""

    weights: int = 0  # resident between steps (partitions, replicas, frozen base, quantized storage)
    gathered_forward: int = 0  # ZeRO-3 / FSDP params gathered while computing (forward)
    gathered_backward: int = 0  # ... and in backward
    # FSDP2 when the loss runs after the model returned (torchtune): gathered while the loss runs (None: as in
    # forward), at the output projection, at backward's start after the root's all-gather, and during that all-gather
    gathered_loss: int | None = None
    gathered_head: int = 0
    gathered_backward_start: int | None = None
    regather: int = 0
    forward_flat: int = 0  # an all-gather output FSDP2 keeps from the head to forward's end (accelerate's tail unit)
    gathered_end: int = 0  # still gathered while the last gradient is reduced (FSDP1's root, at its post-backward)
    head_grads: int | None = None  # the output head's gradient bytes held from backward's start (None: by its params)
    # sharded gradients already reduced while backward's last layers run (None: all of grads_after_backward; FSDP with
    # the root gathered reduces the root last and the last layers' gradients after them)
    grads_at_end: int | None = None
    autocast_cache: int = 0  # bf16 copies of fp32 weights cached during forward (docs/knobs.md H.4)
    autocast_cache_head: int = 0  # ... of which the output head's, saved for backward even under checkpointing
    recompute_casts: int = 0  # ... made again by a checkpointed layer's recompute, saved until its backward (FSDP)
    # checkpointed layers' inputs and their gradients kept to backward's end, beside the first layer's backward
    # (FSDP1's reshard-only hooks under reentrant checkpointing from the model's loop: states/accelerate_fsdp.py)
    layer_inputs_held: int = 0
    grads_between_steps: int = 0  # gradient storage that exists during forward
    grads_after_backward: int = 0  # all gradient storage at the end of backward
    grads_unreduced: int = 0  # full-size grads of one module waiting for reduce-scatter
    # one layer's weight gradients, made as the top layer's backward runs (its MLP's and output projection's before
    # its attention's backward peaks; one GPU / DDP, where they stay)
    top_layer_grads: int = 0
    # a trainable embedding tied to the head: its gradient bytes (the head's and the embedding's meet at its backward)
    tied_embedding_grads: int = 0
    grads_before_tied: int | None = None  # ... the other gradients then (None: all but it; FSDP: their shards)
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
    # device bytes by category at each moment of the engine's initialization (flatten copies, scratch, states made
    # at init), the load phase's candidates beside the steady states at load; empty: no such moment
    load_moments: list[dict[str, int]] = field(default_factory=list)
    resume_host: int = 0  # extra host bytes per rank while a checkpoint loads
    paged_optimizer: int = 0  # cudaMallocManaged states: outside torch's counters, on the device
    host: list[HostBuffer] = field(default_factory=list)  # per rank
    notes: list[str] = field(default_factory=list)

    @property
    def host_bytes(self) -> int:
        return sum(b.resident for b in self.host)


def total(tensors, pred=lambda t: True) -> int:
    return sum(t.total for t in tensors if pred(t))


def largest_module(tensors: list[ParamTensor]) -> int:
    return max((t.numel for t in tensors), default=0)


def quantized_bytes(s: Scenario) -> float:
    if s.model.quantization == "gptq-int4":
        return GPTQ_BYTES_PER_GROUP_OF_128
    if s.model.quantization == "fp8":
        return FP8_BLOCK_BYTES
    if s.tuning == "qlora" and s.quant_bits == 8:
        return int8_bytes(s.model.hidden_size)  # the narrowest input of a layer's Linears: errs high
    return NF4_DQ_BYTES if s.double_quant else NF4_BYTES


def frozen_bytes(s: Scenario, tensors: list[ParamTensor]) -> float:
    """Bytes of frozen weights: 4-bit storage for quantized linears, compute dtype for the rest."""
    fp32 = s.precision == "fp32" or s.kbit_upcast and s.tuning == "qlora" or s.frozen_fp32_in_module
    frozen_dtype = 4 if fp32 else s.compute_bytes

    def dtype(t: ParamTensor) -> float:  # a frozen adapter tensor (VeRA's projections) has the adapters' dtype
        if t.element_bytes and s.engine != "deepspeed":  # DeepSpeed casts the whole module, buffers too
            return t.element_bytes
        return quantized_bytes(s) if t.quantized else s.adapter_bytes if t.kind == "lora" else frozen_dtype
    return sum(t.total * dtype(t) for t in tensors if not t.trainable)


def trainable_dtype_bytes(s: Scenario, t: ParamTensor) -> int:
    """dtype of a trainable tensor as it lives in the module (outside DeepSpeed)."""
    if t.kind == "lora":
        return s.adapter_bytes
    return 2 if s.precision.endswith("pure") else 4


def layer_elements(s: Scenario, tensors: list[ParamTensor]) -> int:
    """Elements of one decoder layer (the FSDP / ZeRO-3 gather unit), or the largest module outside them."""
    layers = max(s.model.num_layers, 1)
    per_layer = sum(t.total for t in tensors if t.per_layer) // layers
    return max(per_layer, largest_module([t for t in tensors if not t.per_layer]))


def partition_order(s: Scenario, tensors: list[ParamTensor]) -> list[int]:
    """Parameter sizes in module order: embeddings, each decoder layer's tensors, then the rest."""
    head = [t.numel for t in tensors if not t.per_layer and t.kind == "embedding" for _ in range(t.count)]
    layers = max(s.model.num_layers, 1)
    per_layer = [t for t in tensors if t.per_layer]
    body = [t.numel for _ in range(layers) for t in per_layer for _ in range(max(1, t.count // layers))]
    tail = [t.numel for t in tensors if not t.per_layer and t.kind != "embedding" for _ in range(t.count)]
    return head + body + tail


def partition_sizes(s: Scenario, tensors: list[ParamTensor]) -> list[int]:
    """Each trainable parameter's per-rank share, in module order."""
    return [-(-numel // s.world_size) for numel in partition_order(s, [t for t in tensors if t.trainable])]


def _adam_state_bytes(optimizer: str, param_bytes: int) -> float:
    return {
        "adamw-foreach": 2 * param_bytes,
        "adamw-fused": 2 * param_bytes,
        "adamw-loop": 2 * param_bytes,
        "adamw-8bit": ADAM8BIT_BYTES,
        "paged-adamw-8bit": ADAM8BIT_BYTES,
        "paged-adamw-32bit": 8,
        "sgd": 0,
        "adafactor": 0,
    }[optimizer]


def _adafactor_bytes(trainable: list[ParamTensor], param_bytes: int) -> int:
    """Adafactor keeps factored row and column second moments for matrices, full ones for vectors."""
    out = 0
    for t in trainable:
        width = t.in_features + t.out_features if t.in_features and t.out_features else t.numel
        out += width * t.count * param_bytes
    return out


def torch_optimizer(s: Scenario, trainable: list[ParamTensor]) -> tuple[int, int, int]:
    """(states, step temporaries, paged states) of a torch/bitsandbytes optimizer over the given tensors."""
    states = temps = paged = 0
    for t in trainable:
        pb = trainable_dtype_bytes(s, t)
        st = int(t.total * _adam_state_bytes(s.optimizer, pb))
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
