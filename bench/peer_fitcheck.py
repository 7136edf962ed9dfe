"""fitcheck-llm as a peer of bench/peers.py: a scenario asked the way a user asks its `fitcheck` command.

    pip install -e ".[peers]"        # fitcheck-llm==0.3.1: click, rich, huggingface_hub; no torch

fitcheck (github.com/Anassbzdd/fitcheck) reads a model's config.json and answers, for one GPU, the memory
of full, LoRA or QLoRA (nf4) fine-tuning: weights, adapters, optimizer states, gradients, activations
and a CUDA-context/fragmentation overhead, a fit verdict (safe / uncertain / does_not_fit) and the
largest micro-batch that fits. Its Python API is `fetch_model_config(hub_id)` -> `estimate(ModelConfig,
TrainingConfig, GpuSpec)` -> `MemoryReport`, which is what its CLI calls.

Fed offline: `fetch_model_config` downloads config.json with `hf_hub_download` and asks the hub for the
checkpoint's safetensors parameter count (refusing when its own formula is > 2% off). Nothing here
reaches a hub, so both calls are answered locally: the download by the config.json transformers' own
config class writes for our catalog model, the count by the parameters of the transformers model built
from it (what the safetensors total of the real checkpoint holds). Everything fitcheck does with the file
(MoE / multimodal refusal, field checks, parameter formula, the 2% check) is its own code.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from unittest import mock

from memfit.errors import MemfitError
from memfit.facts.catalog import ModelSpec
from memfit.facts.scenario import Scenario

PINNED = "0.3.1"  # pyproject.toml extra `peers`; the mapping below was read from this release's source
MIB = 2**20
# memfit GPU id -> the `--gpu` name a user picks from fitcheck's GPU_DB (its usable MiB, its overhead
# profiles); a card it lacks goes in as `--vram-mib` (it takes 95% as usable)
GPU_KEYS = {
    "rtx3090": "3090", "rtx4090": "4090", "rtx5090": "5090", "a10": "a10", "a10g": "a10", "l4": "l4",
    "l40s": "l40s", "rtxa6000": "a6000", "rtx6000ada": "rtx6000-ada", "a100-40gb": "a100-40",
    "a100-80gb": "a100-80", "a100-80gb-pcie": "a100-80", "a800-80gb": "a100-80", "a800-80gb-pcie": "a100-80",
    "h100": "h100", "h100-pcie": "h100", "h200": "h200", "b200": "b200", "v100-16gb": "v100-16", "t4": "t4",
}
# fitcheck's LoRA targets are the Llama module names; memfit's roles name the same Linears
ROLE_TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
                "up": "up_proj", "down": "down_proj"}
ALL_LINEAR = tuple(ROLE_TARGETS.values())  # fitcheck's "full" preset = PEFT all-linear on a Llama decoder
OPTIMIZERS = {"adamw-foreach": "adamw", "adamw-fused": "adamw", "adamw-loop": "adamw",
              "paged-adamw-32bit": "adamw", "adamw-8bit": "adam8bit", "paged-adamw-8bit": "adam8bit",
              "sgd": "sgd"}


class NotModeled(Exception):
    """The row asks for something fitcheck has no input for: no number."""


@dataclass
class Answer:
    value: int | None  # bytes on the GPU (fitcheck's total), None = no answer
    applies: bool  # fitcheck models every knob of this row
    note: str
    label: str | None = None  # "fits" / "oom" by fitcheck's own verdict


def installed_version() -> str | None:
    try:
        return version("fitcheck-llm")
    except PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------- the model
def write_config(spec: ModelSpec, folder: Path) -> Path:
    """config.json as transformers' config class writes it for this catalog model (what the hub serves)."""
    from memfit.trace.build import family_of, hf_config

    _, substitute = family_of(spec)
    if substitute:  # the trace builds a stand-in family; the hub's file has other keys (Qwen-1: doubled FFN)
        raise MemfitError(f"the hub's config.json of {substitute} is remote code, not written by transformers")
    path = folder / "config.json"
    path.write_text(json.dumps(hf_config(spec, "eager").to_dict()))
    return path


def read_model(config_path: Path, hub_id: str, hub_params: int | None):
    """fitcheck's own reading of config.json, with its two hub calls answered from local facts."""
    import fitcheck.config_parser as parser

    with mock.patch.object(parser, "hf_hub_download", lambda **_: str(config_path)), \
            mock.patch.object(parser, "_reported_param_count", lambda *_: hub_params):
        return parser.fetch_model_config(hub_id)


def load_model(config_path: Path, hub_id: str, hub_params: int | None):
    """fitcheck's ModelConfig from a config.json, or the reason it has none."""
    import fitcheck

    try:
        return read_model(config_path, hub_id, hub_params)
    except fitcheck.UnsupportedModelError as e:
        return f"refused: {str(e).split('. ')[0]}"
    except (ValueError, KeyError, OSError) as e:  # its field checks, or a file that is not a config
        return f"config.json not read: {e}"


@cache
def model_for(spec: ModelSpec, hub_params: int | None):
    """load_model for a catalog model (cached: one config.json and one read per model; the file is read once)."""
    with tempfile.TemporaryDirectory(prefix="memfit-fitcheck-") as folder:
        try:
            path = write_config(spec, Path(folder))
        except MemfitError as e:
            return f"no config.json: {e}"
        return load_model(path, spec.id, hub_params)


# ---------------------------------------------------------------------------------------------- the knobs
def _targets(s: Scenario) -> tuple[list[str], list[str]]:
    """(fitcheck's target names, targets of this model it has no name for). A name the model lacks is left
    out, as PEFT leaves it (one list of targets is often written for several families)."""
    names, dropped = [], []
    for t in s.lora_targets:
        roles = s.model.linear_names.get(t)
        if t in ("all-linear", "all"):
            names += ALL_LINEAR
        elif t in ALL_LINEAR or t in ROLE_TARGETS:
            names.append(ROLE_TARGETS.get(t, t))
        elif roles and all(r in ROLE_TARGETS for r in roles):
            names += [ROLE_TARGETS[r] for r in roles]  # a fused Linear (c_attn) as the roles it computes
        elif roles or t == "lm_head":
            dropped.append(t)
    return list(dict.fromkeys(names)), dropped


def _optimizer(s: Scenario) -> tuple[str, str]:
    """(optimizer, AdamW state dtype): pure 16-bit full training keeps AdamW states in the weights' dtype."""
    if s.optimizer not in OPTIMIZERS:
        raise NotModeled(f"optimizer {s.optimizer}")
    pure_full = s.tuning == "full" and s.precision.endswith("-pure")
    return OPTIMIZERS[s.optimizer], "bf16" if pure_full else "fp32"


def training_config(s: Scenario) -> tuple[object, list[str]]:
    """fitcheck's TrainingConfig for the scenario, and notes on what it reads differently (n/a)."""
    from fitcheck import TrainingConfig

    if s.method != "sft":
        raise NotModeled(f"method {s.method} (one model only)")
    if s.tuning not in ("full", "lora", "qlora"):
        raise NotModeled(f"tuning {s.tuning} (full, LoRA and QLoRA only)")
    differs = []
    targets, dropped = _targets(s) if s.uses_adapters else (list(ALL_LINEAR), [])
    if dropped:
        differs.append(f"targets {','.join(dropped)} dropped")
    if not targets:
        raise NotModeled(f"LoRA targets {','.join(s.lora_targets)}")
    optimizer, state_dtype = _optimizer(s)
    if s.tuning == "qlora" and s.model.quantization:
        differs.append(f"{s.model.quantization} base as nf4")
    if s.dora:
        differs.append("dora")
    if s.loss != "standard":
        differs.append(f"loss {s.loss}")
    if s.checkpointing not in ("off", "full"):
        differs.append(f"checkpointing {s.checkpointing}")
    if s.offload_optimizer != "none" or s.offload_param != "none" or s.fsdp_cpu_offload:
        differs.append("offload")
    if s.world_size > 1:
        differs.append(f"{s.engine}x{s.world_size} (one GPU, no sharding)")
    config = TrainingConfig(
        precision=s.precision[:4].rstrip("-"), quantization="nf4" if s.tuning == "qlora" else "none",
        double_quant=s.tuning == "qlora" and s.double_quant, optimizer=optimizer, optimizer_dtype=state_dtype,
        batch_size=s.micro_batch, seq_len=s.seq_len, lora_rank=s.lora_rank if s.uses_adapters else None,
        lora_targets=targets, grad_checkpoint=s.checkpointing != "off",
        # CUDA SDPA runs flash / memory-efficient kernels: no s^2 score matrix, as with --flash-attn
        flash_attn=s.attention in ("flash", "sdpa"), grad_accum_steps=s.grad_accum)
    return config, differs


def gpu_spec(s: Scenario):
    from fitcheck import get_gpu

    key = GPU_KEYS.get(s.hardware.gpu.id)
    return get_gpu(key) if key else get_gpu(s.hardware.gpu.name, vram_mib=s.hardware.gpu.memory_bytes // MIB)


# ---------------------------------------------------------------------------------------------- the answer
def answer(s: Scenario, model) -> Answer:
    """fitcheck's total for the scenario; `model` is `model_for`'s result (a ModelConfig or a reason)."""
    from fitcheck import estimate

    if isinstance(model, str):
        return Answer(None, False, model[:160])
    try:
        training, differs = training_config(s)
        report = estimate(model, training, gpu_spec(s))
    except NotModeled as e:
        return Answer(None, False, f"skipped: {e} not modeled")
    except ValueError as e:  # fitcheck's own refusal of a knob value
        return Answer(None, False, f"skipped: {str(e)[:100]}")
    label = "oom" if report.verdict == "does_not_fit" else "fits"  # "uncertain" fits, as memfit's "tight"
    notes = ([f"n/a {'; '.join(differs)}"] if differs else []) + [f"{report.verdict}, max b{report.max_batch_size}"]
    return Answer(int(report.total_mib * MIB), not differs, " ".join(notes), label)


def fitcheck_answer(s: Scenario, hub_params: int | None) -> Answer:
    """The peer's answer for one scenario, or why there is none (never raises for a row it cannot answer)."""
    if installed_version() is None:
        return Answer(None, False, f"not installed (pip install fitcheck-llm=={PINNED})")
    return answer(s, model_for(s.model, hub_params))
