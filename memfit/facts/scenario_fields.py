"""The fields of a Scenario: the model, the machine and every knob of data/knobs.toml, with their types.

Written by memfit/facts/knob_source.py from the knob table; do not edit by hand (`python -m
memfit.facts.knob_source --write` rewrites it, tests/test_knob_types.py fails when it is stale). The rules
between knobs and the derived facts are memfit/facts/scenario.py's Scenario, which adds them to these fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from memfit.facts.assumptions import Assumption
from memfit.facts.catalog import ModelSpec
from memfit.facts.hardware import Hardware

# the choices of each knob that has them (knobs.toml `choices`)
Method = Literal['sft', 'pt', 'dpo', 'ipo', 'kto', 'orpo', 'simpo', 'rm', 'ppo', 'grpo']
Tuning = Literal['full', 'freeze', 'lora', 'qlora', 'ia3', 'vera', 'adalora', 'loha', 'lokr', 'oft', 'boft', 'prompt', 'ptuning', 'ln_tuning', 'trainable_tokens', 'llama_adapter', 'llama_adapter_v2']
QuantBits = Literal[4, 8]
Precision = Literal['bf16-mixed', 'fp16-mixed', 'bf16-pure', 'fp16-pure', 'fp32']
AdapterDtype = Literal['fp32', 'bf16', 'fp16']
Optimizer = Literal['adamw-foreach', 'adamw-fused', 'adamw-loop', 'adamw-8bit', 'paged-adamw-8bit', 'paged-adamw-32bit', 'sgd', 'adafactor']
Checkpointing = Literal['off', 'full', 'every_n', 'offload', 'unsloth']
Attention = Literal['eager', 'sdpa', 'flash']
Padding = Literal['padded', 'packed', 'padding_free']
Loss = Literal['standard', 'liger', 'chunked_nll', 'chunked_output', 'inplace_ce', 'unsloth_ce']
Engine = Literal['single', 'ddp', 'deepspeed', 'fsdp']
OffloadOptimizer = Literal['none', 'cpu', 'nvme']
OffloadParam = Literal['none', 'cpu', 'nvme']
GradAccumDtype = Literal['fp32', 'bf16', 'fp16']
FsdpStrategy = Literal['full_shard', 'shard_grad_op', 'hybrid_shard', 'no_shard']
Colocate = Literal['none', 'actor-ref', 'critic-reward', 'actor-ref+critic-reward', 'all']


@dataclass(frozen=True)
class ScenarioFields:
    """The data of a run; memfit/facts/scenario.py Scenario adds the rules (see its docstring)."""
    model: ModelSpec
    hardware: Hardware
    method: Method = 'sft'
    tuning: Tuning = 'full'
    lora_rank: int = 8
    lora_alpha: int | None = None
    lora_targets: tuple[str, ...] = ('all-linear',)
    modules_to_save: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    dora: bool = False
    quant_bits: QuantBits = 4
    double_quant: bool = True
    freeze_trainable_layers: int = 2
    virtual_tokens: int = 20
    trainable_tokens: int = 0
    precision: Precision = 'bf16-mixed'
    adapter_dtype: AdapterDtype = 'fp32'
    autocast: bool = False
    frozen_fp32: bool = False
    kbit_upcast: bool = False
    bnb_saves_input: bool = False
    low_cpu_mem_usage: bool = True
    optimizer: Optimizer = 'adamw-fused'
    optimizer_in_backward: bool = False
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    checkpointing: Checkpointing = 'off'
    checkpoint_every_n: int = 1
    reentrant: bool = False
    attention: Attention = 'sdpa'
    padding: Padding = 'padded'
    loss: Loss = 'standard'
    engine: Engine = 'single'
    zero_stage: int | None = None
    offload_optimizer: OffloadOptimizer = 'none'
    offload_param: OffloadParam = 'none'
    ratio: float = 1.0
    pin_memory: bool = True
    optimizer_init_step: bool = False
    reduce_bucket_size: int = 500000000
    overlap_comm: bool | None = None
    contiguous_gradients: bool = True
    prefetch_bucket_size: int = 50000000
    param_persistence_threshold: int = 100000
    max_live_parameters: int = 1000000000
    sub_group_size: int = 1000000000
    grad_accum_dtype: GradAccumDtype | None = None
    zero3_init: bool = True
    fsdp_strategy: FsdpStrategy | None = None
    fsdp_version: int = 2
    fsdp_cpu_offload: bool = False
    fsdp_cpu_ram_efficient_loading: bool = True
    ref_model: str | None = None
    precompute_ref_log_probs: bool = False
    ref_offload: bool = False
    reward_model: str | None = None
    reward_offload: bool = False
    remote_reward: bool = False
    critic_model: str | None = None
    init_kl_coef: float = 0.01
    colocate: Colocate = 'none'
    vllm_engines: int | None = None
    vllm_tp: int = 1
    vllm_gpu_memory_utilization: float = 0.95
    vllm_sleep: bool = False
    deepspeed_sleep: bool = False
    rollout_micro_batch: int | None = None
    role_gpus: tuple[tuple[str, int], ...] = ()
    param_offload: bool = False
    optimizer_offload: bool = False
    critic_param_offload: bool = False
    critic_optimizer_offload: bool = False
    dynamic_bsz: bool = False
    ppo_max_token_len: int | None = None
    log_prob_max_token_len: int | None = None
    rollout_n: int = 1
    response_len: int | None = None
    remove_padding: bool = False
    entropy_chunking: bool = False
    entropy_checkpointing: bool = False
    profile: str = "hf-trainer"
    releases: tuple[tuple[str, str], ...] = ()
    assumed: tuple[Assumption, ...] = field(default=(), compare=False)
    unread: tuple[str, ...] = field(default=(), compare=False)
