"""The real, randomly initialised model of a scenario, built by the trace's builder on a real device.

`memfit.trace.build.build_model(scenario, device="cpu")` builds the transformers model (+ PEFT LoRA,
freezing, dtypes, activation checkpointing) exactly as the trace does, but with real tensors. With
`model_dir` the weights come from a local Hugging Face folder instead (`from_pretrained`), and the same
tuning steps follow.
"""
from __future__ import annotations

import contextlib

import torch

from memfit.errors import MemfitError
from memfit.facts.scenario import Scenario


def build_model(scenario: Scenario, device: str = "cpu", init_context=None, model_dir: str | None = None):
    """(model the loop calls, autocast dtype or None, notes). `init_context` wraps construction
    (deepspeed.zero.Init for ZeRO-3)."""
    from memfit.trace import build as tb
    from memfit.trace.peft import apply_peft

    if model_dir is not None:
        with init_context or contextlib.nullcontext():
            return _from_pretrained(scenario, model_dir, device, tb)
    if init_context is None or not _peft_on_plain_weights(scenario):
        with init_context or contextlib.nullcontext():
            built = tb.build_model(scenario, device=device)
        return built.model, built.autocast_dtype, built.notes + repair_uninitialized(built.model)
    # Under zero.Init only the base model is built partitioned; PEFT adds the adapters afterwards, outside
    # the context, as a training script does (adapters made inside it come out with 0 elements).
    with init_context:
        built = tb.build_model(scenario.with_changes(tuning="full"), device=device)
    model = apply_peft(built.hf_model, scenario, built.family)
    model.train()
    tb.set_dtypes(model, scenario)
    return model, built.autocast_dtype, built.notes + repair_uninitialized(model)


def repair_uninitialized(model) -> list[str]:
    """Give random values to parameters that model construction left as raw `torch.empty` memory.

    Under zero.Init, transformers 5.24 leaves Mixtral's router and stacked experts uninitialized (its
    `_init_weights` writes to the empty local stand-ins, not the partitions): the loss is NaN, DeepSpeed
    skips every step as an overflow, Adam never creates m and v, and the measured peak is the optimizer's
    2 x 4 B x P short (bench/engine.py's Mixtral ZeRO-3 row, FINDINGS.md). Only reductions to a scalar
    and in-place writes: nothing the size of a weight is allocated, so the measured load is unchanged."""
    std = getattr(getattr(model, "config", None), "initializer_range", 0.02)
    repaired = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = getattr(p, "ds_tensor", p.data)
            if local.numel() == 0 or not local.is_floating_point():
                continue
            extreme = max(abs(local.amax().item()), abs(local.amin().item()))
            if not extreme < 1e4:  # also catches nan
                local.normal_(0.0, std)
                repaired.append(name)
    return [f"{len(repaired)} uninitialized parameters given random values (e.g. {repaired[0]})"] if repaired else []


def _peft_on_plain_weights(scenario: Scenario) -> bool:
    """PEFT adapters over a 16-bit base (QLoRA's 4-bit base is not measured)."""
    return scenario.uses_adapters and scenario.tuning != "qlora"


def _from_pretrained(scenario: Scenario, model_dir: str, device: str, tb):
    from transformers import AutoModelForCausalLM

    frozen, _, _ = tb.dtypes_for(scenario)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=frozen, device_map={"": device},
                                                        attn_implementation=tb.attn_implementation(scenario))
    except (OSError, ValueError) as e:
        raise MemfitError(f"cannot load a model from {model_dir!r}: {str(e).splitlines()[0]}") from None
    hf_model.config.use_cache = False
    hf_model.train()
    model = hf_model
    if _peft_on_plain_weights(scenario):
        from memfit.trace.peft import apply_peft

        model = apply_peft(hf_model, scenario, hf_model.config.model_type)
        model.train()
    else:
        tb.set_trainable(model, hf_model, scenario)
    tb.set_dtypes(model, scenario)
    tb.enable_checkpointing(hf_model, scenario)
    autocast = tb.compute_dtype(scenario) if tb.uses_autocast(scenario) else None
    return model, autocast, [f"weights loaded from {model_dir}"]


def count_params(model) -> tuple[int, int]:
    """(total, trainable) parameter counts; ZeRO-3 partitioned params count their full size."""
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


def upcast_trainable(model) -> None:
    """accelerate's FSDP path: trainable low-precision params become fp32 masters before sharding."""
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
