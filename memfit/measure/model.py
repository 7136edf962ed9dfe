"""Build a real, randomly initialised transformers model (+ PEFT LoRA) from a memfit ModelSpec.

The trace helper's `memfit.trace.build.build_model` is used when it exists and builds real tensors;
otherwise this small builder covers the llama / qwen2 families (the ones measure runs on the CPU).
"""
from __future__ import annotations

import contextlib

import torch

from memfit.catalog import ModelSpec
from memfit.errors import MemfitError
from memfit.scenario import Scenario

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_ROLE_ORDER = ("q", "k", "v", "o", "gate", "up", "down", "fc", "proj")


def hf_config(spec: ModelSpec, attention: str):
    """The transformers config for a catalog architecture (llama / qwen2 families)."""
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, tie_word_embeddings=spec.tie_embeddings, max_position_embeddings=max(spec.max_position_embeddings, 4096),
        use_cache=False,
    )
    if spec.arch == "llama":
        config = LlamaConfig(**common, attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias)
    elif spec.arch == "qwen2":
        config = Qwen2Config(**common)
    else:
        raise MemfitError(f"memfit measure builds llama and qwen2 architectures on the CPU; {spec.id} is {spec.arch!r}")
    config._attn_implementation = attention
    return config


def _trace_builder():
    try:
        from memfit.trace import build  # the trace helper's builder, if present
    except ImportError:
        return None
    return getattr(build, "build_model", None)


def build_model(scenario: Scenario, dtype: torch.dtype, attention: str, init_context=None):
    """Random-init model in `dtype`; `init_context` (e.g. deepspeed.zero.Init) wraps construction."""
    from transformers import AutoModelForCausalLM

    config = hf_config(scenario.model, attention)
    with init_context or contextlib.nullcontext():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    model.config.use_cache = False
    return model


def lora_targets(scenario: Scenario) -> list[str] | str:
    """PEFT `target_modules` for the scenario's LoRA targets (roles map to module names via the catalog)."""
    targets = scenario.lora.targets
    if "all-linear" in targets:
        return "all-linear"
    names = scenario.model.linear_names or {}
    out = []
    for t in targets:
        if t in names:
            out.append(t)
        else:
            matched = [n for n, roles in names.items() if t in roles]
            if not matched:
                raise MemfitError(f"LoRA target {t!r} matches no linear of {scenario.model.id}; known: {', '.join(names)}")
            out.extend(matched)
    return sorted(set(out))


def apply_tuning(model, scenario: Scenario):
    """LoRA via PEFT (adapters upcast to fp32 unless adapter_dtype says otherwise), or layer freezing."""
    if scenario.tuning == "lora":
        from peft import LoraConfig, get_peft_model

        lora = scenario.lora
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha or 2 * lora.rank, lora_dropout=lora.dropout,
                            target_modules=lora_targets(scenario), use_dora=lora.dora, task_type="CAUSAL_LM")
        model = get_peft_model(model, config, autocast_adapter_dtype=scenario.adapter_dtype == "fp32")
        if scenario.adapter_dtype != "fp32":
            for name, p in model.named_parameters():
                if p.requires_grad:
                    p.data = p.data.to(DTYPES[scenario.adapter_dtype])
    elif scenario.tuning == "freeze":
        layers = model.model.layers
        keep = set(range(len(layers) - scenario.freeze_trainable_layers, len(layers)))
        for name, p in model.named_parameters():
            p.requires_grad = any(f"layers.{i}." in name for i in keep)
    return model


def enable_checkpointing(model, scenario: Scenario) -> None:
    if scenario.checkpointing == "off":
        return
    kwargs = {"use_reentrant": scenario.reentrant}
    every = scenario.checkpoint_every_n if scenario.checkpointing == "every_n" else 1
    offload = scenario.checkpointing == "offload"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.activation_checkpointing_enable(kwargs, every_n_layers=every, offload=offload)
    if scenario.tuning == "lora" and scenario.reentrant:
        base.enable_input_require_grads()


def count_params(model) -> tuple[int, int]:
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable


def lm_head_of(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings()
