"""Build the real transformers (+ PEFT) model of a Scenario: on the meta device, on fake tensors, or for real.

`build_model(scenario, device=...)` is shared by `trace` (fake tensors on the CPU) and `measure`
(real, small models on CPU or CUDA). Steps, in the order a training script does them:

1. `hf_config(spec)`: the transformers config class of the catalog family, with exactly the catalog's
   numbers. Families that only exist as hub remote code are built as their transformers-native twin
   (`SUBSTITUTES`), which has the same tensor shapes; the substitution is reported in `notes`.
2. The model, in the compute dtype, with the attention implementation of the scenario
   (`flash` is memfit's FlashAttention-2 stand-in, see `cuda.py`).
3. Trainability: full, freeze (last N decoder layers), or PEFT LoRA/DoRA on the scenario's targets.
4. Dtypes (`dtypes_for`): bf16-pure = everything bf16; bf16-mixed (single GPU / DDP) = trainable
   params fp32 + autocast; engines that keep their own fp32 master (DeepSpeed, FSDP) run the module
   in the compute dtype without autocast; LoRA adapters in `scenario.adapter_dtype`.
5. QLoRA: 4-bit stand-ins for every non-head Linear (`quant.py`).
6. Activation checkpointing per scenario (off / full / every_n / offload / unsloth, reentrant or not).
7. On fake tensors: `to_empty` under the FakeTensorMode, then the shared weights are tied again
   (`to_empty` gives each module its own copy).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from memfit.facts.catalog import ModelSpec, architectures
from memfit.errors import MemfitError
from memfit.facts.scenario import Scenario
from memfit.trace.peft import apply_peft, is_adapter

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Hub remote-code families -> the transformers-native family with the same parameter shapes.
SUBSTITUTES = {
    "chatglm": "glm",  # THUDM ChatGLM/GLM-4 remote code == transformers `glm` (the -hf checkpoints)
    "qwen": "qwen2",  # Qwen-1 c_attn (q,k,v with bias) == Qwen2 q/k/v with bias
    "internlm2": "llama",  # fused wqkv == separate q,k,v of the same total width
    "baichuan": "llama",  # W_pack == q,k,v; ALiBi (13B) is not modelled
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class BuiltModel:
    model: torch.nn.Module  # what the training loop calls (PeftModel or the transformers model)
    hf_model: PreTrainedModel  # the transformers *ForCausalLM inside
    compute_dtype: torch.dtype
    autocast_dtype: torch.dtype | None  # None = no autocast region
    family: str  # transformers model_type actually built
    attn_implementation: str
    notes: list[str] = field(default_factory=list)

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.hf_model.get_output_embeddings()


# ---------------------------------------------------------------------------------------------- configs
def _standard(spec: ModelSpec) -> dict:
    return dict(
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        vocab_size=spec.vocab_size,
        tie_word_embeddings=spec.tie_embeddings,
    )


def _llama(spec):
    return _standard(spec) | dict(attention_bias=spec.qkv_bias or spec.o_bias, mlp_bias=spec.mlp_bias)


def _no_head_dim(spec):
    cfg = _standard(spec)
    if spec.head_dim * spec.num_heads != spec.hidden_size:
        raise MemfitError(f"{spec.id}: transformers derives head_dim = hidden/heads for this family, "
                          f"but the catalog says {spec.head_dim}")
    del cfg["head_dim"]
    return cfg


def _mixtral(spec):
    return _standard(spec) | dict(intermediate_size=spec.moe_intermediate_size or spec.intermediate_size,
                                  num_local_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token)


def _qwen2_moe(spec):
    return _no_head_dim(spec) | dict(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                                     moe_intermediate_size=spec.moe_intermediate_size,
                                     shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
                                     decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=spec.qkv_bias)


def _qwen3_moe(spec):
    return _with_bias(spec) | dict(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                                   moe_intermediate_size=spec.moe_intermediate_size, decoder_sparse_step=1,
                                   mlp_only_layers=[], norm_topk_prob=True)


def _deepseek_mla(spec):  # DeepSeek-V2/V3 built as transformers' deepseek_v3 (same parameter layout)
    x = spec.extra
    return dict(hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size,
                moe_intermediate_size=spec.moe_intermediate_size, n_routed_experts=spec.num_experts,
                num_experts_per_tok=spec.experts_per_token, n_shared_experts=x.get("n_shared_experts", 0),
                first_k_dense_replace=x.get("first_k_dense_replace", 0), q_lora_rank=x.get("q_lora_rank") or None,
                kv_lora_rank=x["kv_lora_rank"], qk_rope_head_dim=x["qk_rope_head_dim"],
                qk_nope_head_dim=x["qk_nope_head_dim"], v_head_dim=x["v_head_dim"], vocab_size=spec.vocab_size,
                tie_word_embeddings=spec.tie_embeddings, n_group=1, topk_group=1, attention_bias=spec.qkv_bias)


def _gemma(spec):
    return _standard(spec) | dict(attention_bias=spec.qkv_bias, query_pre_attn_scalar=spec.head_dim)


def _with_bias(spec):
    return _standard(spec) | dict(attention_bias=spec.qkv_bias)


def _falcon(spec):
    new_arch = spec.norms_per_layer == 2
    return dict(hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_kv_heads=spec.num_kv_heads, new_decoder_architecture=new_arch,
                multi_query=(spec.num_kv_heads == 1 and not new_arch), parallel_attn=True, bias=spec.qkv_bias,
                ffn_hidden_size=spec.intermediate_size or 4 * spec.hidden_size, vocab_size=spec.vocab_size,
                tie_word_embeddings=spec.tie_embeddings, alibi=spec.position == "alibi")


def _gpt_bigcode(spec):
    return dict(n_embd=spec.hidden_size, n_layer=spec.num_layers, n_head=spec.num_heads,
                n_inner=spec.intermediate_size or 4 * spec.hidden_size, vocab_size=spec.vocab_size,
                n_positions=spec.max_position_embeddings or 8192, multi_query=spec.num_kv_heads == 1,
                tie_word_embeddings=spec.tie_embeddings)


def _starcoder2(spec):
    return _no_head_dim(spec) | dict(use_bias=spec.qkv_bias)


def _bloom(spec):
    return dict(hidden_size=spec.hidden_size, n_layer=spec.num_layers, n_head=spec.num_heads,
                vocab_size=spec.vocab_size, tie_word_embeddings=spec.tie_embeddings)


CONFIG_BUILDERS = {
    "llama": _llama,
    "mistral": _standard,
    "mixtral": _mixtral,
    "qwen2": _no_head_dim,
    "qwen3": _with_bias,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_mla,
    "gemma2": _gemma,
    "gemma3_text": _gemma,
    "glm": _with_bias,
    "glm4": _with_bias,
    "phi3": _no_head_dim,
    "falcon": _falcon,
    "gpt_bigcode": _gpt_bigcode,
    "starcoder2": _starcoder2,
    "olmo": lambda s: _no_head_dim(s) | dict(attention_bias=s.qkv_bias),
    "olmo2": lambda s: _no_head_dim(s) | dict(attention_bias=s.qkv_bias),
    "bloom": _bloom,
}


def family_of(spec: ModelSpec) -> tuple[str, str | None]:
    """(transformers model_type to build, catalog family it substitutes for or None)."""
    arch = spec.arch
    substitute = None
    if arch in SUBSTITUTES:
        arch, substitute = SUBSTITUTES[arch], arch
    if spec.encoder_decoder:
        raise MemfitError(f"{spec.id}: encoder-decoder models are counted but not traced")
    types = architectures().get(arch, {}).get("hf_model_types", [arch])
    for model_type in [arch, *types]:
        if model_type in CONFIG_BUILDERS:
            return model_type, substitute
    raise MemfitError(f"trace does not support the {spec.arch!r} family yet; supported: "
                      f"{', '.join(sorted(CONFIG_BUILDERS))}")


def hf_config(spec: ModelSpec, attn_implementation: str = "sdpa"):
    """The transformers config of `spec`, with the catalog's numbers and no cache (training)."""
    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = _config_from_file(spec)
        if config is None:
            model_type, _ = family_of(spec)
            config = AutoConfig.for_model(model_type, **CONFIG_BUILDERS[model_type](spec))
    config.use_cache = False
    config._attn_implementation = attn_implementation
    # pad/bos/eos ids of the default config may lie outside a small test vocabulary
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(config, name, None) is not None:
            setattr(config, name, None)
    return config


def _config_from_file(spec: ModelSpec):
    """The user's own config.json, read by transformers itself, so the trace does not inherit memfit's
    reading of it; None for a catalog model or a family transformers does not know (hub remote code)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = json.loads(Path(spec.config_file).read_text()) if spec.config_file else {}
    data = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    return AutoConfig.for_model(**data) if data.get("model_type") in CONFIG_MAPPING else None


# ---------------------------------------------------------------------------------------------- dtypes
def compute_dtype(scenario: Scenario) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[scenario.precision[:4].rstrip("-")]


def uses_autocast(scenario: Scenario) -> bool:
    """Whether forward runs under autocast: `Scenario.runs_autocast` (mixed precision on plain torch, or a
    trainer that enables it over 16-bit weights, as HF Trainer's bf16=True does)."""
    return scenario.runs_autocast


def fp32_trainable(scenario: Scenario) -> bool:
    """Mixed precision on plain torch (single GPU, DDP) keeps trainable params in fp32. DeepSpeed bf16/fp16
    casts the module to 16 bit and keeps fp32 masters inside its optimizer (docs/knobs.md A.1); FSDP
    MixedPrecision runs the module in the compute dtype."""
    return scenario.precision.endswith("-mixed") and scenario.engine in ("single", "ddp")


def dtypes_for(scenario: Scenario) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(frozen params, trainable params, LoRA adapters) dtypes."""
    compute = compute_dtype(scenario)
    trainable = torch.float32 if fp32_trainable(scenario) else compute
    adapters = torch.float32 if scenario.precision == "fp32" else DTYPES[scenario.adapter_dtype]
    frozen = torch.float32 if scenario.frozen_fp32_in_module else compute
    return frozen, trainable, adapters


def _decoder_layers(hf_model) -> list[torch.nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers: list[torch.nn.Module] = [m for m in hf_model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise MemfitError(f"cannot find the decoder layers of {type(hf_model).__name__}")
    return layers


def set_trainable(model, hf_model, scenario: Scenario) -> None:
    if scenario.tuning == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    elif scenario.tuning == "freeze":
        for p in model.parameters():
            p.requires_grad_(False)
        layers = _decoder_layers(hf_model)
        n = scenario.freeze_trainable_layers  # LLaMA-Factory: > 0 = last n layers, < 0 = first |n|
        chosen = layers[-n:] if n > 0 else layers[:-n]
        for layer in chosen:
            for p in layer.parameters():
                p.requires_grad_(True)


def set_dtypes(model, scenario: Scenario) -> None:
    frozen, trainable, adapters = dtypes_for(scenario)
    for name, p in model.named_parameters():
        if is_adapter(name, scenario):
            dtype = adapters
        else:
            dtype = trainable if p.requires_grad else frozen
        if p.dtype != dtype and p.is_floating_point():
            p.data = p.data.to(dtype)
    for name, b in model.named_buffers():
        if is_adapter(name, scenario) and b.is_floating_point():  # VeRA's projections: with the adapters
            b.data = b.data.to(adapters)
        elif b.is_floating_point() and b.dtype not in (torch.float32, frozen) and "inv_freq" not in name:
            b.data = b.data.to(frozen)


def upcast_non_quantized(model) -> None:
    """PEFT prepare_model_for_kbit_training casts every fp16/bf16 parameter that is not 4-bit to fp32
    (peft/utils/other.py); embeddings, norms and the head become fp32, so the residual stream does too."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and p.dtype in (torch.bfloat16, torch.float16) and "lora_" not in name:
            p.data = p.data.to(torch.float32)


# ---------------------------------------------------------------------------------------------- checkpointing
def enable_checkpointing(hf_model, scenario: Scenario, host_transfer=None) -> None:
    """HF activation checkpointing as the frameworks switch it on (docs/knobs.md C.2).

    `host_transfer` (offload / unsloth): how tensors go to the host and back (`offload.HostTransfer`);
    the tracer passes one that labels the host copies so they are not counted as device memory.
    """
    mode = scenario.checkpointing
    if mode == "off":
        return
    kwargs = {"use_reentrant": scenario.reentrant}
    every = scenario.checkpoint_every_n if mode == "every_n" else 1
    hf_model.activation_checkpointing_enable(kwargs, every_n_layers=every)
    if mode in ("offload", "unsloth"):
        from memfit.trace.offload import checkpoint_function

        func = checkpoint_function(mode, scenario.reentrant, host_transfer)
        for module in hf_model.modules():
            if hasattr(module, "_gradient_checkpointing_func"):
                module._gradient_checkpointing_func = func


# ---------------------------------------------------------------------------------------------- fake tensors
def tie_weights_again(hf_model) -> None:
    """`to_empty` gives tied modules separate tensors; make the output embedding share the input's again."""
    if getattr(hf_model.config, "tie_word_embeddings", False):
        out, inp = hf_model.get_output_embeddings(), hf_model.get_input_embeddings()
        if out is not None and inp is not None:
            # PEFT wraps the head: LoRA keeps it as base_layer, modules_to_save as original_module (its trainable
            # copy is not tied)
            target = getattr(out, "original_module", None) or getattr(out, "base_layer", out)
            # LoRA's trainable_token_indices wraps the embedding: its `.weight` is a merged copy, not the parameter
            source = inp.token_adapter.base_layer if hasattr(inp, "token_adapter") else inp
            target.weight = source.weight


def attn_implementation(scenario: Scenario, device: str | torch.device | None = None) -> str:
    """transformers' attn_implementation: `flash` is the real flash_attention_2 on a CUDA device that has
    flash_attn installed, memfit's stand-in (`cuda.py`) everywhere else."""
    if scenario.attention == "flash":
        from transformers.utils import is_flash_attn_2_available

        if device is not None and torch.device(device).type == "cuda" and is_flash_attn_2_available():
            return "flash_attention_2"
        from memfit.trace.cuda import register_flash

        return register_flash()
    return scenario.attention


def _check_traceable(model_class, scenario: Scenario, family: str) -> None:
    if scenario.attention == "flash" and not getattr(model_class, "_supports_attention_backend", False):
        raise MemfitError(f"transformers' {family} attention does not go through AttentionInterface, so the trace's "
                          f"FlashAttention-2 stand-in cannot replace it; trace it with --attn sdpa or eager")
    if scenario.model.is_moe and fp32_trainable(scenario) and scenario.tuning in ("full", "freeze"):
        raise MemfitError("transformers' grouped_mm MoE experts need bf16 weights, and mixed precision on plain "
                          "torch keeps trainable weights in fp32; trace MoE full tuning with bf16-pure or an engine "
                          "(deepspeed / fsdp) that runs the module in bf16")


def build_model(scenario: Scenario, device: str | torch.device = "meta", fake_mode=None,
                host_transfer=None) -> BuiltModel:
    """The scenario's model ready to train.

    device "meta" + `fake_mode`: built on meta, materialized as fake tensors on the CPU (the trace).
    Any other device: built and initialized there for real (small models; `measure`).
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    spec = scenario.model
    attn = attn_implementation(scenario, None if fake_mode is not None else device)
    config = hf_config(spec, attn)
    family, substitute = (config.model_type, None) if spec.config_file and config.model_type else family_of(spec)
    frozen, _, _ = dtypes_for(scenario)
    notes = []
    if substitute:
        notes.append(f"{substitute} (hub remote code) built as transformers '{family}': same tensor shapes")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    _check_traceable(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], scenario, family)
    real_device = torch.device(device)
    build_on = torch.device("meta") if fake_mode is not None else real_device
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with build_on, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_model = AutoModelForCausalLM.from_config(config, dtype=frozen, attn_implementation=attn)
    except ValueError as e:  # e.g. "Gemma2ForCausalLM does not support ... scaled_dot_product_attention"
        raise MemfitError(f"transformers cannot build {spec.id} with --attn {scenario.attention}: "
                          f"{str(e).split('. ')[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    hf_model.train()
    model = hf_model
    if scenario.uses_adapters:
        with build_on, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # PEFT asks transformers v5's deprecated GC property
            model = apply_peft(hf_model, scenario, family)
        model.train()
    else:
        set_trainable(model, hf_model, scenario)
    set_dtypes(model, scenario)
    if scenario.tuning == "qlora":
        from memfit.trace.quant import quantize_linears

        notes.append(quantize_linears(model, hf_model, frozen, scenario.quant_bits))
        if scenario.kbit_upcast:
            upcast_non_quantized(model)
            notes.append("prepare_model_for_kbit_training: every non-4-bit parameter upcast to fp32")
    enable_checkpointing(hf_model, scenario, host_transfer)
    if fake_mode is not None:
        with fake_mode:
            for module in model.modules():  # each module once: PEFT's prompt learning reaches the embedding twice
                module.to_empty(device="cpu", recurse=False)
        tie_weights_again(hf_model)
    elif real_device.type != "meta":
        tie_weights_again(hf_model)
    autocast = compute_dtype(scenario) if uses_autocast(scenario) else None
    return BuiltModel(model, hf_model, compute_dtype(scenario), autocast, family, attn, notes)

