"""Step-time model, used only to RANK configurations that fit; it does not promise seconds.

One optimizer step = `grad_accum` micro-steps + once-per-step work. Each part is a time from a count
(FLOPs or bytes) over a rate from the catalog; every rate is an assumption in data/speed.toml.

Per micro-step, on one GPU:
- matmuls: forward 2 FLOPs per weight per token; backward 2 for the input gradient (through frozen
  weights too, down to the lowest trainable layer) + 2 for the weight gradient of trainable weights only.
  So full fine-tuning is 6 x params x tokens, a frozen base under LoRA 4x plus 6x the adapters, freeze
  tuning 2x everywhere plus 4x in the trained top layers. MoE experts count at experts_per_token /
  num_experts. lm_head is a matmul even when tied. Time = FLOPs / (bf16 TFLOP/s x MFU per GPU x shape
  factors tokens / (tokens + half_tokens) x hidden / (hidden + half_hidden)); fp32 runs at a fraction of
  the rate. PEFT methods other than LoRA add the work speed_peft.py counts from PEFT's layer code; prompt
  methods' virtual tokens widen every row.
- attention: causal 2·B·T²·(heads·head_dim) FLOPs per layer forward with flash kernels (masked half
  skipped), twice that for eager / masked SDPA; backward 2.5x (flash) or 2x; eager also moves the T x T
  scores through memory (bytes / bandwidth), which is what makes it slow at long sequences.
- recompute under checkpointing: one more forward (matmuls + attention + element-wise) of each
  checkpointed layer.
- memory-bound work: element-wise ops per token per layer (bytes counted in the real step by
  tools/count_traffic.py, by kind, residual dtype, adapted Linears and dropout), the loss over tokens x vocab (standard
  cross entropy moves ~28 B per logit, Liger's fused loss ~8); dequantization of each quantized weight
  (bitsandbytes QLoRA, GPTQ) in forward, backward and recompute, per byte of stored weight.
- fixed costs: eager PyTorch launches every kernel from Python, so a micro-step takes at least its
  launches x the launch cost (small micro-batches are launch-bound), plus a fixed cost per micro-step.
- collectives of a micro-step: ZeRO-2 reduce-scatters gradients; ZeRO-3 and FSDP full_shard all-gather
  parameters in forward and again in backward and reduce-scatter gradients (≈ 3x parameter bytes);
  FSDP shard_grad_op gathers once. Ring traffic (N-1)/N x bytes over interconnect_gbps/2 (one
  direction) x a link efficiency, the slower inter-node link when nodes > 1; only an `exposed`
  fraction is not hidden behind compute.
- offload transfers of a micro-step: gradients to the host (optimizer offload), parameters from the
  host for each gather (ZeRO-3 offload_param, FSDP CPU offload), offloaded checkpoints down and up; at
  a host-link rate that halves without pinned memory.

Once per step:
- collectives: DDP / ZeRO-0 all-reduce gradients (2x gradient bytes); ZeRO-1 reduce-scatter +
  all-gather (2x); ZeRO-2 all-gathers the updated parameters (1x).
- optimizer: on the GPU memory-bound (bytes per parameter by optimizer), over the rank's partition;
  offloaded: DeepSpeedCPUAdam (or torch AdamW on CPU for FSDP / torchtune) over the rank's partition on the
  threads its launcher gives it (speed_host.py), plus the updated 16-bit parameters sent back up. `ratio` keeps a share of the
  sub-groups on the GPU. `optimizer_in_backward` hides part of the GPU step behind backward.

Throughput counts real tokens: a padded batch of several rows is `padded_fill` real tokens, packed and
padding-free batches are full. Tokens per second are for the whole job (all GPUs).

Not modeled (equal for the configurations a plan compares, or outside its search): the data loader,
torch.compile, fused-kernel plugins other than the loss (fms-acceleration's FOAK, Liger's RMSNorm / RoPE),
tensor / pipeline / sequence parallelism, MoE all-to-all. Generation (vLLM) and the extra models of preference / RL methods are in step_time.py,
built on `nograd_forward_seconds`, `gather_seconds` and `host_link_bytes_per_second` below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from memfit.dtypes import NF4_BYTES
from memfit.facts.adapters import wraps
from memfit.facts.catalog import ModelSpec
from memfit.facts.engines import engine_of
from memfit.facts.frameworks import model_code
from memfit.facts.scenario import Scenario
from memfit.memory.activations import residual_bytes
from memfit.memory.inventory import saved_copies, tuned_tensors
from memfit.planner.speed_constants import GB, assumptions
from memfit.planner.speed_host import host_link, optimizer_and_offload
from memfit.planner.speed_peft import adapter_work, virtual_tokens

__all__ = ["GB", "StepTime", "assumptions", "gather_seconds", "host_link_bytes_per_second", "nograd_forward_seconds",
           "param_counts", "train_step_time"]


@dataclass(frozen=True)
class StepTime:
    seconds: float  # one optimizer step (all micro-batches)
    tokens_per_second: float  # real tokens per second, whole job
    tokens_per_step: int  # real tokens per optimizer step, whole job
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds per part, summing to `seconds`

    def to_json(self) -> dict:
        return {"step_seconds": self.seconds, "tokens_per_second": self.tokens_per_second,
                "tokens_per_step": self.tokens_per_step, "breakdown_seconds": dict(self.breakdown)}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts the FLOP and traffic terms need (MoE experts scaled to the active share)."""

    layer_matmul: int  # active Linear weights inside decoder layers
    layer_matmul_trainable: int
    head: int  # lm_head matmul (vocab x hidden), tied or not
    head_trainable: bool
    adapters: int  # LoRA parameters (active)
    adapted_linears: int  # Linear modules per decoder layer that carry a LoRA-style adapter (PEFT wraps them)
    total: int  # every base parameter (gathered by ZeRO-3 / FSDP)
    trainable: int
    quantized: int  # 4-bit stored parameters
    backward_layer_fraction: float  # share of decoder layers backward runs through


def param_counts(s: Scenario) -> ParamCounts:
    return _param_counts(s.model, s.tuning, s.lora_rank, s.lora_targets, s.dora, s.freeze_trainable_layers,
                         s.virtual_tokens, s.modules_to_save if s.uses_adapters else (), s.releases)


@cache
def _param_counts(model: ModelSpec, tuning: str, rank: int, targets: tuple, dora: bool,
                  trainable_layers: int, virtual_tokens: int = 20, modules_to_save: tuple = (),
                  releases: tuple = ()) -> ParamCounts:
    tensors = tuned_tensors(model, tuning, rank, targets, dora, trainable_layers, virtual_tokens, releases)
    tensors += saved_copies(model, tensors, modules_to_save)
    expert_share = model.experts_per_token / model.num_experts if model.is_moe else 1.0

    def active(t) -> float:
        return t.total * (expert_share if ".experts." in t.name else 1.0)

    layer = [t for t in tensors if t.per_layer and t.kind in ("linear", "router")]
    head_trainable = any(t.trainable for t in tensors if t.kind == "lm_head" or
                         (model.tie_embeddings and t.kind == "embedding" and t.module == "embed_tokens"))
    fraction = trainable_layers / model.num_layers if tuning == "freeze" else 1.0
    return ParamCounts(
        layer_matmul=int(sum(active(t) for t in layer)),
        layer_matmul_trainable=int(sum(active(t) for t in layer if t.trainable)),
        head=model.vocab_size * model.hidden_size,
        head_trainable=head_trainable,
        adapters=int(sum(active(t) for t in tensors if t.kind == "lora")),
        adapted_linears=len({t.module for t in tensors if t.kind == "lora" and t.per_layer})
        if tuning in ("lora", "qlora") or wraps(tuning) == "linear" else 0,
        total=sum(t.total for t in tensors if t.kind != "lora"),
        trainable=sum(t.total for t in tensors if t.trainable),
        quantized=sum(t.total for t in tensors if t.quantized),
        backward_layer_fraction=min(1.0, fraction),
    )


def _checkpointed_fraction(s: Scenario) -> float:
    if s.checkpointing == "off":
        return 0.0
    if s.checkpointing == "every_n":
        layers = s.model.num_layers
        return -(-layers // s.checkpoint_every_n) / layers
    return 1.0


def _padding_fill(s: Scenario) -> float:
    if s.padding != "padded" or s.micro_batch == 1:
        return 1.0
    return assumptions()["data"]["padded_fill"]


def _row_tokens(s: Scenario) -> int:
    """Positions one row runs through the layers: the sequence and a prompt method's virtual tokens."""
    return s.seq_len + virtual_tokens(s)


def _rates(s: Scenario) -> tuple[float, float]:
    """(matmul FLOP/s, memory-bound bytes/s) for this GPU at this micro-batch and model width."""
    a = assumptions()
    gpu = s.hardware.gpu
    mfu = a["mfu"].get(gpu.speed_id, a["mfu"]["default"])
    tokens = s.micro_batch * _row_tokens(s)
    shape = a["shape"]
    narrow = (tokens / (tokens + shape["half_tokens"])
              * s.model.hidden_size / (s.model.hidden_size + shape["half_hidden"]))
    flops = max(gpu.bf16_tflops, 1.0) * 1e12 * mfu * narrow
    if s.precision == "fp32":
        flops *= a["compute"]["fp32_rate_fraction"]
    bandwidth = max(gpu.memory_bandwidth_gbps, 1.0) * GB * a["compute"]["bandwidth_efficiency"]
    return flops, bandwidth


def _attention(s: Scenario, bwd: float, ck: float, flop_rate: float, bandwidth: float) -> float:
    """Per layer T x T per row: causal 2 B T^2 width FLOPs forward with flash kernels (masked half skipped)."""
    at = assumptions()["attention"]
    m = s.model
    rows, t = s.micro_batch, _row_tokens(s)
    causal_fwd = 2 * rows * t * t * m.num_heads * m.head_dim
    masked = s.padding == "padded" and s.micro_batch > 1
    if s.attention == "flash" or (s.attention == "sdpa" and not masked):
        eff = at["flash"] if s.attention == "flash" else at["sdpa"]
        return m.num_layers * causal_fwd * (1 + at["flash_backward_factor"] * bwd + ck) / (flop_rate * eff)
    eff = at["sdpa_masked"] if s.attention == "sdpa" else 1.0
    seconds = m.num_layers * 2 * causal_fwd * (1 + at["eager_backward_factor"] * bwd + ck) / (flop_rate * eff)
    if s.attention == "eager":
        scores = rows * m.num_heads * t * t
        seconds += m.num_layers * scores * at["eager_bytes_per_score"] * (1 + ck / 3) / bandwidth
    return seconds


def _dequant(s: Scenario, p: ParamCounts, passes: float) -> float:
    """Each quantized weight unpacked to 16-bit in every pass that reads it, per byte of stored weight."""
    q = assumptions()["quantization"]
    gptq = (s.model.quantization or "").startswith("gptq")
    stored = p.quantized * (NF4_BYTES if gptq or s.quant_bits == 4 else 1.0)
    return stored * passes * q["gptq_seconds_per_byte" if gptq else "bnb_seconds_per_byte"]


def _elementwise_bytes(s: Scenario, p: ParamCounts) -> tuple[float, float]:
    """(forward, backward) bytes per token, layer and unit of hidden size of the memory-bound ops (speed.toml
    [compute], counted by tools/count_traffic.py): by kind, residual dtype, adapted Linears per layer (linear
    between the attention projections, 4, and every Linear, 7) and LoRA dropout. A framework that runs its own
    model code (a [model_code] table: torchtune, LitGPT, unsloth) has its own LoRA, not PEFT's: the full row."""
    c = assumptions()["compute"]
    peft = not model_code(s.profile)
    kind = "full" if not (p.adapted_linears and peft) else "qlora" if p.quantized else "lora"
    key = f"{kind}-{8 * residual_bytes(s)}"
    if kind == "full":
        return c["elementwise_forward"][key], c["elementwise_backward"][key]
    share = (p.adapted_linears - 4) / 3
    dropout = "-dropout" if s.lora_dropout > 0 else ""

    def at(phase: str) -> float:
        row = c[f"elementwise_{phase}"]
        few, every = row[key + dropout], row[f"{key}-all{dropout}"]
        return max(0.0, few + share * (every - few))
    return at("forward"), at("backward")


def _micro_compute(s: Scenario, p: ParamCounts) -> dict[str, float]:
    """Seconds of GPU work in one micro-step: matmuls, attention, recompute, memory-bound kernels."""
    a = assumptions()
    flop_rate, bandwidth = _rates(s)
    m = s.model
    n = s.micro_batch * _row_tokens(s)
    ck = _checkpointed_fraction(s) * p.backward_layer_fraction  # only layers backward reaches recompute
    bwd = p.backward_layer_fraction
    extra = adapter_work(s, a["peft"])
    layer_fwd = 2 * p.layer_matmul + 2 * p.adapters + extra.flops_per_token_forward
    forward = layer_fwd + 2 * p.head
    backward = (2 * p.layer_matmul * bwd + 2 * p.layer_matmul_trainable + 2 * p.head
                + (2 * p.head if p.head_trainable else 0) + 4 * p.adapters + extra.flops_per_token_backward)
    if s.loss == "chunked_nll":
        forward += 2 * p.head  # TRL checkpoints each lm_head chunk: its forward runs again in backward
    parts = {
        "matmul": n * (forward + backward) / flop_rate,
        "recompute": n * ck * layer_fwd / flop_rate,
        "attention": _attention(s, bwd, ck, flop_rate, bandwidth),
    }
    fwd_bytes, bwd_bytes = _elementwise_bytes(s, p)
    parts["elementwise"] = n * m.num_layers * m.hidden_size * (fwd_bytes * (1 + ck) + bwd_bytes * bwd) / bandwidth
    parts["loss"] = n * m.vocab_size * a["loss"][s.loss] / bandwidth
    if extra.fixed_flops or extra.fixed_weight_bytes:  # weights PEFT rebuilds in each forward (and recompute)
        parts["adapter_weights"] = (1 + ck / 2) * (extra.fixed_flops / flop_rate
                                                   + extra.fixed_weight_bytes / bandwidth)
    if p.quantized:
        parts["dequant"] = _dequant(s, p, 1 + bwd + ck)
    return parts


def _launch_seconds(s: Scenario, p: ParamCounts) -> float:
    """Seconds Python needs to launch one micro-step's kernels (forward, backward ~2x, recompute)."""
    o = assumptions()["overhead"]
    bwd = p.backward_layer_fraction
    passes = 1 + 2 * bwd + _checkpointed_fraction(s) * bwd
    adapted = len(s.lora_targets) if s.uses_adapters and wraps(s.tuning) == "linear" else 0
    per_layer = o["kernels_per_layer_forward"] + adapted * o["kernels_per_adapter_forward"]
    return s.model.num_layers * per_layer * passes * o["kernel_launch_seconds"]


def _link_bytes_per_second(s: Scenario) -> float:
    a = assumptions()["comm"]
    gpu = s.hardware.gpu
    eff = a["efficiency"].get(gpu.interconnect, a["efficiency"]["default"])
    rate = gpu.interconnect_gbps / 2 * eff  # catalog figure is bidirectional
    if s.hardware.nodes > 1:
        rate = min(rate, a["internode_gbps"])
    return max(rate, 0.1) * GB


def _grad_bytes(s: Scenario) -> int:
    """dtype of the gradients that travel: fp32 when plain torch trains fp32 weights under autocast."""
    if s.precision == "fp32" or engine_of(s).fp32_grads(s) and s.tuning in ("full", "freeze"):
        return 4
    return 2


def _collectives(s: Scenario, p: ParamCounts) -> tuple[float, float]:
    """(seconds per micro-step, seconds per step) of exposed collective traffic."""
    n = s.world_size
    if n == 1:
        return 0.0, 0.0
    engine = engine_of(s)
    ring = (n - 1) / n / _link_bytes_per_second(s)
    exposed = assumptions()["comm"]["exposed"].get(engine.speed_key(s), 0.5)
    weights = p.quantized * NF4_BYTES + (p.total - p.quantized) * s.compute_bytes
    grads = p.trainable * _grad_bytes(s)
    t = engine.traffic(s)
    per_micro = t.weights_per_micro * weights + t.grads_per_micro * grads
    per_step = t.grads_per_step * grads
    return per_micro * ring * exposed, per_step * ring * exposed


def nograd_forward_seconds(s: Scenario) -> float:
    """One no-grad forward of a micro-batch (a reference / reward / rollout log-prob pass): the forward
    share of the matmuls, attention and element-wise work of `_micro_compute`, no backward, no recompute."""
    p = _param_counts(s.model, "full", 8, (), False, s.model.num_layers)
    flop_rate, bandwidth = _rates(s)
    m, at = s.model, assumptions()["attention"]
    n = s.tokens_per_micro_batch
    matmul = n * (2 * p.layer_matmul + 2 * p.head) / flop_rate
    causal = 2 * s.micro_batch * s.seq_len ** 2 * m.num_heads * m.head_dim * m.num_layers
    if s.attention == "eager":
        attn = 2 * causal / flop_rate + m.num_layers * s.micro_batch * m.num_heads * s.seq_len ** 2 \
            * at["eager_bytes_per_score"] / 3 / bandwidth
    else:
        attn = causal / (flop_rate * (at["flash"] if s.attention == "flash" else at["sdpa"]))
    elementwise = n * m.num_layers * m.hidden_size * _elementwise_bytes(s, p)[0] / bandwidth
    return matmul + attn + elementwise


def gather_seconds(s: Scenario, param_bytes: float) -> float:
    """Exposed time of one ZeRO-3 / FSDP all-gather of `param_bytes` over the ring (0 on one GPU)."""
    n = s.world_size
    if n == 1:
        return 0.0
    exposed = assumptions()["comm"]["exposed"].get(engine_of(s).speed_key(s), 0.5)
    return param_bytes * (n - 1) / n / _link_bytes_per_second(s) * exposed


def host_link_bytes_per_second(s: Scenario, pinned: bool = True) -> float:
    return host_link(s, pinned)


def train_step_time(s: Scenario) -> StepTime:
    """One optimizer step of one trained model (memfit/planner/step_time.py adds the other roles of a run)."""
    p = param_counts(s)
    _, bandwidth = _rates(s)
    micro = _micro_compute(s, p)
    launches = _launch_seconds(s, p)
    micro["launch_bound"] = max(0.0, launches - sum(micro.values()))  # the GPU waits for Python to launch
    micro["fixed"] = assumptions()["overhead"]["micro_step_seconds"]
    comm_micro, comm_step = _collectives(s, p)
    micro["collectives"] = comm_micro
    off_micro, step = optimizer_and_offload(s, p.trainable, p.total, bandwidth,
                                            _checkpointed_fraction(s) * p.backward_layer_fraction)
    for k, v in off_micro.items():
        micro[k] = micro.get(k, 0.0) + v
    step["collectives"] = comm_step
    accum = s.grad_accum
    breakdown = {k: v * accum for k, v in micro.items()}
    for k, v in step.items():
        breakdown[k] = breakdown.get(k, 0.0) + v
    seconds = sum(breakdown.values())
    tokens = int(s.tokens_per_micro_batch * _padding_fill(s) * accum * s.world_size)
    return StepTime(seconds=seconds, tokens_per_second=tokens / seconds, tokens_per_step=tokens,
                    breakdown={k: v for k, v in breakdown.items() if v > 0})
