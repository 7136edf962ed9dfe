"""A training run described as plain, validated data: model, hardware, and every memory knob.

Importers and the CLI build a `Scenario`; the estimator, planner, trace and measure read it.
Nothing here computes memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from memfit.facts.catalog import GpuSpec, ModelSpec
from memfit.errors import MemfitError

TUNINGS = ("full", "freeze", "lora", "qlora")
PRECISIONS = ("bf16-mixed", "fp16-mixed", "bf16-pure", "fp16-pure", "fp32")
OPTIMIZERS = (
    "adamw-foreach",
    "adamw-fused",
    "adamw-loop",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw-32bit",
    "sgd",
    "adafactor",
)
ENGINES = ("single", "ddp", "deepspeed", "fsdp")
CHECKPOINTING = ("off", "full", "every_n", "offload", "unsloth")
ATTENTIONS = ("eager", "sdpa", "flash")
PADDINGS = ("padded", "packed", "padding_free")
LOSSES = ("standard", "liger", "chunked_nll", "chunked_output")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
FSDP_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
LORA_ROLES = ("q", "k", "v", "o", "gate", "up", "down", "fc", "proj")
# Training methods. sft/pt train one model; the rest run several (memfit/roles/estimate.py, catalog/methods.toml).
SINGLE_MODEL_METHODS = ("sft", "pt")
MULTI_MODEL_METHODS = ("dpo", "ipo", "kto", "orpo", "simpo", "rm", "ppo", "grpo")
METHODS = SINGLE_MODEL_METHODS + MULTI_MODEL_METHODS
COLOCATIONS = ("none", "actor-ref", "critic-reward", "actor-ref+critic-reward", "all")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise MemfitError(message)


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    _require(value in valid, f"{name} {value!r} is not valid; choose one of: {', '.join(valid)}")


def _positive(name: str, value: int) -> None:
    _require(isinstance(value, int) and value > 0, f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Hardware:
    gpu: GpuSpec
    gpus_per_node: int = 1
    nodes: int = 1
    host_ram_bytes: int | None = None  # per node; None = unknown, no host verdict

    def __post_init__(self) -> None:
        _positive("--gpus (GPUs per node)", self.gpus_per_node)
        _positive("--nodes", self.nodes)
        _require(self.gpu.memory_bytes > 0, f"GPU memory must be positive, got {self.gpu.memory_bytes}")
        if self.host_ram_bytes is not None:
            _require(self.host_ram_bytes > 0, f"--host-ram must be positive, got {self.host_ram_bytes}")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 8
    alpha: int | None = None
    targets: tuple[str, ...] = ("all-linear",)  # module names, roles, or "all-linear"
    dora: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:
        _positive("--lora-rank", self.rank)
        _require(0.0 <= self.dropout < 1.0, f"--lora-dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class DeepSpeedConfig:
    """`zero_optimization` knobs; defaults are DeepSpeed 0.19's pydantic defaults (knobs.md A.3)."""

    stage: int = 0
    offload_optimizer: str = "none"
    offload_param: str = "none"
    ratio: float = 1.0
    pin_memory: bool = True  # default True since DeepSpeed 0.19.5 (knobs.md A.3)
    reduce_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None  # None = DeepSpeed's rule: True iff stage 3
    contiguous_gradients: bool = True
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    grad_accum_dtype: str | None = None  # None = model dtype
    zero3_init: bool = True

    def __post_init__(self) -> None:
        _require(self.stage in (0, 1, 2, 3), f"ZeRO stage {self.stage!r} does not exist; valid stages: 0, 1, 2, 3")
        _one_of("offload_optimizer device", self.offload_optimizer, OFFLOAD_DEVICES)
        _one_of("offload_param device", self.offload_param, OFFLOAD_DEVICES)
        _require(0.0 <= self.ratio <= 1.0, f"offload ratio must be within [0, 1], got {self.ratio}")
        _require(
            self.ratio == 1.0 or self.stage == 3,
            "DeepSpeed rejects offload ratio < 1 outside ZeRO-3 (config.py offload_ratio_check); use --zero 3",
        )
        _require(
            self.ratio == 1.0 or self.offload_optimizer != "none",
            "offload ratio needs optimizer offload; add --offload-optimizer cpu",
        )
        _require(
            self.offload_param == "none" or self.stage == 3,
            "DeepSpeed rejects offload_param outside ZeRO-3 (parameter offload is a stage-3 feature); use --zero 3",
        )
        _require(
            self.offload_optimizer == "none" or self.stage > 0,
            "DeepSpeed rejects offload_optimizer with ZeRO-0 (offload needs stage 1, 2 or 3)",
        )
        for name in ("reduce_bucket_size", "prefetch_bucket_size", "sub_group_size", "max_live_parameters"):
            _positive(name, getattr(self, name))
        _require(self.param_persistence_threshold >= 0, "stage3_param_persistence_threshold must be >= 0")
        _require(
            self.grad_accum_dtype in (None, "fp32", "bf16", "fp16"),
            f"grad_accum_dtype {self.grad_accum_dtype!r} is not valid; choose fp32, bf16 or fp16",
        )

    @property
    def overlap(self) -> bool:
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm


@dataclass(frozen=True)
class FsdpConfig:
    strategy: str = "full_shard"
    cpu_offload: bool = False
    cpu_ram_efficient_loading: bool = True

    def __post_init__(self) -> None:
        _one_of("FSDP sharding strategy", self.strategy, FSDP_STRATEGIES)


@dataclass(frozen=True)
class RlConfig:
    """Knobs of preference / RL runs with several models (issue 6; memfit/roles/estimate.py reads them).

    Names follow OpenRLHF (legacy / dotted flag in the comment) and TRL where they differ. None = the
    framework's default, resolved in roles.py. The planner may vary any of these."""

    ref_model: str | None = None  # catalog name of the reference model; None = same as the policy
    precompute_ref_log_probs: bool = False  # TRL precompute_ref_log_probs: no reference model while training
    ref_offload: bool = False  # --ref_offload / --ref.offload (--ref_reward_offload v0.9): ZeRO-3 only
    reward_model: str | None = None  # PPO/GRPO reward model (None = same architecture as the policy)
    reward_offload: bool = False  # --reward.offload (--ref_reward_offload v0.9): ZeRO-3 only
    remote_reward: bool = False  # --remote_rm_url / --reward.remote_url (or a rule reward): no reward model
    critic_model: str | None = None  # PPO critic (None = the reward model's architecture, as OpenRLHF does)
    init_kl_coef: float = 0.01  # --init_kl_coef / --algo.kl.init_coef: the reference exists only when > 0
    colocate: str = "none"  # --colocate_actor_ref / --colocate_critic_reward / --colocate_all_models
    vllm_engines: int | None = None  # --vllm_num_engines / --vllm.num_engines (None = one per GPU / tp)
    vllm_tp: int = 1  # --vllm_tensor_parallel_size / --vllm.tensor_parallel_size
    vllm_gpu_memory_utilization: float = 0.95  # --vllm_gpu_memory_utilization / --vllm.gpu_memory_utilization
    vllm_sleep: bool = False  # --vllm_enable_sleep / --vllm.enable_sleep (level 1: weights to host, KV dropped)
    deepspeed_sleep: bool = False  # --deepspeed_enable_sleep / --ds.enable_sleep: optimizer etc. to host
    rollout_micro_batch: int | None = None  # --micro_rollout_batch_size / --rollout.micro_batch_size
    role_gpus: tuple[tuple[str, int], ...] = ()  # GPUs per role group when not colocated, e.g. (("critic", 4),)

    def __post_init__(self) -> None:
        _one_of("--colocate", self.colocate, COLOCATIONS)
        _positive("--vllm-tp", self.vllm_tp)
        _require(0.0 < self.vllm_gpu_memory_utilization <= 1.0,
                 f"--vllm-mem (gpu_memory_utilization) must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        _require(self.init_kl_coef >= 0, f"--init-kl-coef must be >= 0, got {self.init_kl_coef}")
        if self.vllm_engines is not None:
            _require(isinstance(self.vllm_engines, int) and self.vllm_engines >= 0,
                     f"--vllm-engines must be >= 0, got {self.vllm_engines!r}")
        if self.rollout_micro_batch is not None:
            _positive("--rollout-micro-batch", self.rollout_micro_batch)
        for role, n in self.role_gpus:
            _one_of("--role-gpus role", role, ("actor", "ref", "critic", "reward"))
            _positive(f"--role-gpus {role}", n)


# Flat knob names (CLI, importers, planner) -> RlConfig fields; build_scenario collects them.
RL_KEYS = tuple(f.name for f in fields(RlConfig))


def rl_from_knobs(knobs: dict, method: str) -> RlConfig | None:
    """The RlConfig of a multi-model method from flat knobs (None for sft/pt, which never carry one)."""
    given = {k: knobs[k] for k in RL_KEYS if knobs.get(k) is not None}
    if method in SINGLE_MODEL_METHODS:
        _require(not given, f"{', '.join(sorted(given))} only apply to preference / RL methods "
                            f"({', '.join(MULTI_MODEL_METHODS)}); add --method")
        return None
    if "role_gpus" in given and isinstance(given["role_gpus"], dict):
        given["role_gpus"] = tuple(sorted(given["role_gpus"].items()))
    return RlConfig(**given)


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    hardware: Hardware
    method: str = "sft"
    tuning: str = "full"
    lora: LoraConfig | None = None
    precision: str = "bf16-mixed"
    adapter_dtype: str = "fp32"  # PEFT upcasts adapters of bf16 bases to fp32 (autocast_adapter_dtype)
    autocast: bool = False  # the trainer wraps forward in torch.autocast (HF Trainer bf16=True / fp16=True)
    optimizer: str = "adamw-fused"
    optimizer_in_backward: bool = False  # torchtune optimizer_in_bwd: each param steps as its grad lands
    engine: str = "single"
    deepspeed: DeepSpeedConfig | None = None
    fsdp: FsdpConfig | None = None
    checkpointing: str = "off"
    checkpoint_every_n: int = 1
    reentrant: bool = False
    attention: str = "sdpa"
    padding: str = "padded"
    loss: str = "standard"
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    freeze_trainable_layers: int = 2
    double_quant: bool = True  # bitsandbytes double quantization of the 4-bit absmax (QLoRA)
    kbit_upcast: bool = False  # PEFT prepare_model_for_kbit_training: non-4-bit params to fp32 (knobs D)
    bnb_saves_input: bool = False  # bitsandbytes < 0.43.2 kept each 4-bit Linear's input on ctx (PR #1270)
    low_cpu_mem_usage: bool = True
    profile: str = "hf-trainer"
    rl: RlConfig | None = None  # preference / RL knobs (issue 6); None for sft / pt
    assumed: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _one_of("--tuning", self.tuning, TUNINGS)
        _one_of("--precision", self.precision, PRECISIONS)
        _one_of("--adapter-dtype", self.adapter_dtype, ("fp32", "bf16", "fp16"))
        _one_of("--optimizer", self.optimizer, OPTIMIZERS)
        _one_of("--engine", self.engine, ENGINES)
        _one_of("--ckpt", self.checkpointing, CHECKPOINTING)
        _one_of("--attn", self.attention, ATTENTIONS)
        _one_of("--padding", self.padding, PADDINGS)
        _one_of("--loss", self.loss, LOSSES)
        _one_of("--method", self.method, METHODS)
        for name, value in (("--micro-batch", self.micro_batch), ("--seq", self.seq_len),
                            ("--grad-accum", self.grad_accum), ("--ckpt-every", self.checkpoint_every_n)):
            _positive(name, value)
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.tuning in ("lora", "qlora"):
            _require(self.lora is not None, "LoRA tuning needs LoRA settings (rank, targets)")
        if self.rl is not None:
            _require(self.method in MULTI_MODEL_METHODS,
                     f"preference / RL settings need a multi-model --method ({', '.join(MULTI_MODEL_METHODS)})")
        if self.engine == "deepspeed":
            _require(self.deepspeed is not None, "engine deepspeed needs a ZeRO stage (--zero 0..3)")
        if self.engine == "fsdp":
            _require(self.fsdp is not None, "engine fsdp needs FSDP settings")
        if self.engine == "single":
            _require(self.hardware.world_size == 1,
                     f"engine 'single' runs one GPU but {self.hardware.world_size} were given; use ddp, deepspeed or fsdp")
        if self.attention == "flash":
            _require(self.hardware.gpu.compute_capability >= 8.0,
                     f"flash-attention 2 rejects {self.hardware.gpu.name} (needs compute capability >= 8.0, "
                     f"Ampere or newer); use --attn sdpa")
        if self.loss == "chunked_nll":
            _require(self.lora is None or "lm_head" not in self.lora.targets,
                     "TRL rejects loss_type chunked_nll with LoRA on lm_head")
        if self.precision.startswith("bf16"):
            _require(self.hardware.gpu.compute_capability >= 8.0,
                     f"{self.hardware.gpu.name} has no bf16 support (transformers rejects bf16=True below "
                     f"compute capability 8.0); use --precision fp16-mixed")

    # Derived facts the estimator needs often; small and obvious, so they live here.
    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    @property
    def compute_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def adapter_bytes(self) -> int:
        """LoRA adapter storage: DeepSpeed casts the whole module, adapters included, to 16 bit (engine.py)."""
        if self.precision == "fp32":
            return 4
        if self.engine == "deepspeed":
            return self.compute_bytes
        return 4 if self.adapter_dtype == "fp32" else 2

    @property
    def runs_autocast(self) -> bool:
        """Plain torch (single GPU, DDP) runs forward under autocast for mixed precision, or when the trainer
        asks for it; DeepSpeed and FSDP cast the module to 16 bit instead (knobs.md A.1, B)."""
        if self.engine not in ("single", "ddp") or self.precision == "fp32":
            return False
        return self.autocast or self.precision.endswith("mixed")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    def with_changes(self, **changes) -> "Scenario":
        return replace(self, **changes)
