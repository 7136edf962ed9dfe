"""Published measurements vs memfit: per case predicted vs measured on the case's basis, and labels.

    python bench/published.py --cases cases/published.jsonl [--summary-json]

Reads any file in the schema of cases/README.md (one JSON object per line). Each case maps to a Scenario
through its `profile` (framework defaults) and its stated knobs, its method as sources write it (every
--tuning memfit models, LitGPT's precision and --quantize, PEFT modules_to_save, unsloth's checkpointing);
a case memfit cannot model is listed as skipped with the reason: what memfit does not model.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memfit.facts.adapters import adapter_methods, method_info, wraps  # noqa: E402
from memfit.facts.catalog import custom_gpu, find_gpu, find_model  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.knobs import knob  # noqa: E402
from memfit.facts.methods import several_models  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.facts.versions import installed  # noqa: E402
from memfit.interfaces.render.common import show  # noqa: E402
from shared_cases import PUBLISHED  # noqa: E402

NUMERIC_BASES = ("allocated", "active", "reserved", "device_total", "unknown")
# Which estimate profile answers each basis; "active" is torch's peak active bytes, about allocated;
# "unknown" (method not stated) is compared with reserved, the middle of the three.
BASIS_PROFILE = {"allocated": "allocated", "active": "allocated", "reserved": "reserved",
                 "device_total": "device_total", "unknown": "reserved"}
GPU_TEXT = [  # substring of the case's gpu_type -> catalog id
    ("h100 nvl", "h100-nvl"), ("h100", "h100-sxm"), ("a800", "a800-80gb"), ("a100 40", "a100-40gb"),
    ("a100", "a100-80gb"), ("rtx 4090", "rtx4090"), ("4090", "rtx4090"), ("rtx a6000", "rtx-a6000"),
    ("v100 32", "v100-32gb"), ("v100", "v100-16gb"),
]
# Short tweets padded to the longest row (peft README cases): about 64 tokens per row.
TWEET_TOKENS = 64


class Skip(Exception):
    pass


@dataclass
class BadLine:
    """A line of the case file that is not JSON (read_cases): evaluated as a skipped row."""
    line: int
    error: str


# The case schema (cases/README.md) by the kind of value each key holds. A source may write any of them
# as null, a number as a string ("24"), text as a list of strings (lora_targets: ["q_proj", "v_proj"]) and a unit
# in any case ("gib"); `normalize` turns each into the one shape this bench reads, or skips the row saying which key
# it cannot read. Keys not listed are carried as they are (nothing here reads them).
TEXT_KEYS = ("id", "model", "profile", "method", "lora_targets", "precision", "quantization", "optimizer", "distributed",
             "offload", "gpu_type", "seq_len_kind", "attention_impl", "kernels", "measured_kind", "basis",
             "measured_unit", "value_scope", "outcome", "notes", "source_detail", "reliability", "framework")
COUNT_KEYS = ("lora_rank", "lora_alpha", "zero_stage", "num_gpus", "micro_batch_size", "grad_accum", "seq_len")
NUMBER_KEYS = ("params_b", "gpu_mem_gb", "measured_value", "host_ram_value")
FLAG_KEYS = ("compile",)
# gradient_checkpointing: true / false, or the mode a source names as text (unsloth's use_gradient_checkpointing=
# "unsloth", "offloaded"): a flag, or its words lower-cased (_checkpointing reads them)
MODE_KEYS = ("gradient_checkpointing",)
FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
LIST_KEYS = ("lora_targets",)  # text that may come as a list, kept a list (_lora_targets reads either)


def _text(key: str, value):
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value] if key in LIST_KEYS else ", ".join(map(str, value))
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise Skip(f"case key {key!r}: expected text, got {type(value).__name__} {value!r:.40}")


def _number(key: str, value) -> float:
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, (int, float)) and not isinstance(text, bool) and text == text and abs(text) != float("inf"):
        return text
    try:
        return float(text) if isinstance(text, str) and text and float(text) == float(text) else _bad(key, value)
    except ValueError:
        return _bad(key, value)


def _bad(key: str, value):
    raise Skip(f"case key {key!r}: expected a number, got {type(value).__name__} {value!r:.40}")


def _count(key: str, value) -> int:
    number = _number(key, value)
    if number != int(number):
        raise Skip(f"case key {key!r}: expected a whole number, got {value!r:.40}")
    return int(number)


def _flag(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if word in FLAG_WORDS:
        return FLAG_WORDS[word]
    raise Skip(f"case key {key!r}: expected true or false, got {type(value).__name__} {value!r:.40}")


def _flag_or_mode(key: str, value) -> bool | str:
    """A flag, or the mode a source names in words, lower-cased ("unsloth", "offloaded")."""
    word = value.strip().strip("'\"").lower() if isinstance(value, str) else None
    if word and word not in FLAG_WORDS:
        return word
    return _flag(key, value if word is None else word)


READERS = {**{k: _text for k in TEXT_KEYS}, **{k: _count for k in COUNT_KEYS}, **{k: _number for k in NUMBER_KEYS},
           **{k: _flag for k in FLAG_KEYS}, **{k: _flag_or_mode for k in MODE_KEYS}}


def normalize(case) -> dict:
    """The case with every key this bench reads in one shape (None, or the kind its schema row says); Skip names
    the first key it cannot read."""
    if isinstance(case, BadLine):
        raise Skip(f"line {case.line} is not JSON: {case.error}")
    if not isinstance(case, dict):
        raise Skip(f"a case is a JSON object, got {type(case).__name__}")
    out = dict(case)
    for key, read in READERS.items():
        value = case.get(key)
        out[key] = None if value is None else read(key, value)
    out["id"] = out["id"] or "(no id)"
    if not out["model"]:
        raise Skip("case has no model")
    if out["measured_value"] is not None and not 0 < out["measured_value"] < 1e6:
        raise Skip(f"measured_value {out['measured_value']!r} is not a memory size (0 to 1e6 {out['measured_unit']})")
    if out["gpu_mem_gb"] is not None and not 0 < out["gpu_mem_gb"] < 1e6:
        raise Skip(f"gpu_mem_gb {out['gpu_mem_gb']!r} is not a GPU's memory")
    return out


@dataclass
class Row:
    case: dict
    predicted: float | None = None  # bytes on the case's basis
    measured: float | None = None
    label_ok: bool | None = None
    predicted_label: str | None = None
    skip: str | None = None
    peak_phase: str = ""

    @property
    def error_pct(self) -> float | None:
        if self.predicted is None or self.measured is None:
            return None
        return 100.0 * (self.predicted - self.measured) / self.measured


def _gpu(case: dict):
    text = (case.get("gpu_type") or "").lower()
    gid = next((g for key, g in GPU_TEXT if key in text), None)
    if gid:
        return find_gpu(gid)
    if case.get("gpu_mem_gb"):
        return custom_gpu(int(case["gpu_mem_gb"] * 1e9), like=find_gpu("a100-80gb"))
    return find_gpu("a100-80gb")  # unstated: the numeric comparison does not depend on capacity


def _method(text: str) -> tuple[str, str]:
    """A case's method text -> (memfit method, tuning text): 'dpo (full)' -> ('dpo', 'full'), 'lora' -> ('sft', 'lora').
    Preference / RL methods run several models (memfit/roles/)."""
    m = text.lower().strip()
    head = re.match(r"[a-z]+", m)
    if head and head.group(0) in knob("method").choices and several_models(head.group(0)):
        inner = re.search(r"\((.*)\)", m)
        return head.group(0), inner.group(1) if inner else "full"
    return "sft", m


# A method as sources write it (lower-cased, "_" and "-" read as spaces) -> memfit's --tuning (knobs.toml; the PEFT
# methods are data/adapters.toml's). First match wins: a text that starts "full" is full tuning ("full (train on
# prompt)"), boft before oft, qlora before lora, lora before adapter ("LoRA adapters"), adapter v2 before adapter.
TUNING_WORDS = (
    (r"^full\b", "full"),
    (r"\(ia\)\s*\^?\s*3|\bia\s*\^?\s*3\b", "ia3"),
    (r"\badalora\b", "adalora"),
    (r"\bloha\b", "loha"),
    (r"\blokr\b", "lokr"),
    (r"\bvera\b", "vera"),
    (r"\bboft\b", "boft"),
    (r"\boft\b", "oft"),
    (r"\bprompt ?tuning\b|^prompt$", "prompt"),
    (r"\bp ?tuning\b", "ptuning"),
    (r"\b(ln|layer ?norm) ?tuning\b", "ln_tuning"),
    (r"\btrainable tokens?\b", "trainable_tokens"),
    (r"\bq(lo|do)ra\b|\bgptq\b", "qlora"),
    (r"\b(lo|do)ra\b", "lora"),
    (r"\bfreeze\b", "freeze"),
    (r"\badapter ?v2\b", "llama_adapter_v2"),  # LitGPT finetune adapter_v2 (LLaMA-Adapter v2)
    (r"\badapter\b", "llama_adapter"),  # LitGPT finetune adapter (LLaMA-Adapter)
)
# Methods sources run that memfit has no --tuning for: the skip names what is missing. P-tuning v2 is prefix tuning
# (deep prompts in every layer), as PEFT builds it (PrefixTuningConfig).
UNMODELED_METHODS = (
    (r"\bprefix\b|\bp ?tuning ?v2\b",
     "prefix tuning (PEFT PrefixTuningConfig) is not modeled: memfit has no --tuning for a trained key/value prefix "
     "handed to every layer as past_key_values (data/adapters.toml lists the PEFT methods it models)"),
)
# The base weights a case quantizes, from its quantization key or method text: (pattern, bits, double quant). LitGPT
# writes Fabric's BitsandbytesPrecision modes (--quantize bnb.nf4 | bnb.nf4-dq | bnb.fp4 | bnb.int8-training):
# lightning 2.6.6 fabric/plugins/precision/bitsandbytes.py builds nf4 with compress_statistics=False, nf4-dq with True.
QUANT_WORDS = (  # matched on _words(text): "load_in_8bit" reads "load in 8bit", "bnb.nf4-dq" reads "bnb.nf4 dq"
    (r"\bbnb\.nf4 dq\b", 4, True),
    (r"\bbnb\.nf4\b", 4, False),
    (r"\bnf4\b|\b4 ?bit\b|\bint4\b|\bgptq\b|\bqlora\b|\bqdora\b", 4, None),
    (r"\bint8\b|\b8 ?bit\b", 8, None),  # LLM.int8, load_in_8bit
)
UNMODELED_QUANT = (
    (r"\bfp4\b", "a bitsandbytes FP4 base is not modeled: memfit's 4-bit base is NF4 (knobs.toml quant_bits)"),
    # Fabric's int8-training mode is bnb Linear8bitLt with its default has_fp16_weights=True (bitsandbytes 0.50)
    (r"\bint8 training\b", "LitGPT's bnb.int8-training keeps fp16 weights beside int8 (bnb Linear8bitLt "
                           "has_fp16_weights=True): not memfit's LLM.int8 base (--quant-bits 8: int8 weights only)"),
)
# LLaMA-Adapter is LitGPT's own model code (data/adapters.toml wraps = "prompt_attention"); "adapter" from another
# framework is a bottleneck adapter (Houlsby; adapter-transformers), which memfit does not model
OTHER_ADAPTERS = ("bottleneck adapters (Houlsby, adapter-transformers) are not modeled: memfit's adapter methods are "
                  "LitGPT's LLaMA-Adapter v1 / v2 (--profile litgpt)")


def _words(text: str | None) -> str:
    """Lower case, "_" and "-" as spaces: "LLaMA-Adapter_v2" and "llama adapter v2" read the same."""
    return re.sub(r"[_-]", " ", (text or "").lower())


def _tuning(method: str, profile: str | None) -> str:
    """memfit's --tuning for a method text, or a skip that names what memfit does not model."""
    m = _words(method).strip()
    if not m:
        raise Skip("method not stated")
    for pattern, gap in UNMODELED_METHODS:
        if re.search(pattern, m):
            raise Skip(gap)
    tuning = next((t for pattern, t in TUNING_WORDS if re.search(pattern, m)), None)
    if tuning is None:
        raise Skip(f"method {method!r}: memfit has no --tuning for it (it models {', '.join(knob('tuning').choices)})")
    if wraps(tuning) == "prompt_attention" and profile != "litgpt" and "llama" not in m:
        raise Skip(OTHER_ADAPTERS)
    return tuning


def _quant(case: dict, tuning_text: str) -> tuple[int | None, bool | None]:
    """(bits, double quant) of the base the case quantizes; (None, None) when it keeps 16-bit weights."""
    text = _words(f"{case.get('quantization') or ''} {tuning_text}")
    for pattern, gap in UNMODELED_QUANT:
        if re.search(pattern, text):
            raise Skip(gap)
    hit = next(((bits, dq) for pattern, bits, dq in QUANT_WORDS if re.search(pattern, text)), None)
    if hit and hit[1] is None and re.search(r"double ?quant", text):
        return hit[0], True
    return hit or (None, None)


# Lightning Fabric's precision names (LitGPT's --precision) -> memfit's: "-true" builds the model in that dtype
FABRIC_PRECISION = {"bf16-true": "bf16-pure", "bf16-mixed": "bf16-mixed", "16-true": "fp16-pure",
                    "16-mixed": "fp16-mixed", "32-true": "fp32"}


def _precision(case: dict, tuning: str, quantized: bool) -> str | None:
    """memfit's precision for the case; None: unstated, the profile's default (data/frameworks/<profile>.toml)."""
    p = (case.get("precision") or "").lower()
    fabric = re.search(r"\b(bf16|16|32)-(true|mixed)\b", p)
    if case.get("profile") == "litgpt" and quantized:
        return _litgpt_quantized(case, fabric.group(0) if fabric else None)
    if fabric:
        return FABRIC_PRECISION[fabric.group(0)]
    if not p.strip():
        return None
    if p.startswith("fp32"):
        return "fp32"
    half = "fp16" if p.startswith("fp16") else "bf16"
    if "pure" in p or "over bf16 weights" in p or "torch_dtype float16" in p or "quant_storage" in p:
        return f"{half}-pure"
    if case.get("profile") == "torchtune":
        return "bf16-pure"
    return f"{half}-mixed" if tuning in ("full", "freeze") else f"{half}-pure"  # freeze: whole layers train


def _litgpt_quantized(case: dict, fabric: str | None) -> str:
    """LitGPT refuses --quantize with a mixed precision, its scripts' default (litgpt 0.5.13 finetune/lora.py,
    adapter.py, adapter_v2.py: "Quantization and mixed precision is not supported"): a quantized run that left
    --precision out never ran, so the case's run set a "-true" one, bf16 where the GPU has it (Fabric's
    BitsandbytesPrecision dtype default, lightning 2.6.6)."""
    if fabric and fabric.endswith("mixed"):
        raise Skip(f"LitGPT refuses --quantize with --precision {fabric} (finetune/*.py): the case's precision and "
                   "quantization cannot both hold")
    if fabric:
        return FABRIC_PRECISION[fabric]
    return "bf16-pure" if _gpu(case).compute_capability >= 8.0 else "fp16-pure"


def _optimizer(case: dict) -> tuple[str | None, bool]:
    o = (case.get("optimizer") or "").lower()
    in_bwd = "in_bwd" in o or "into backward" in o or "optimizer_in_bwd" in (case.get("notes") or "")
    if "paged" in o and "8" in o or "pagedadamw8bit" in (case.get("notes") or "").lower():
        return "paged-adamw-8bit", in_bwd
    if "paged" in o:
        return "paged-adamw-32bit", in_bwd
    if "8bit" in o:
        return "adamw-8bit", in_bwd
    if "deepspeed" in o:
        return "adamw-fused", in_bwd
    if "adamw" in o:
        return "adamw-foreach", in_bwd  # torch AdamW picks foreach on CUDA; HF adamw_torch is that
    return None, in_bwd


def _engine(case: dict) -> dict:
    d = (case.get("distributed") or "single").lower()
    if "deepspeed" in d and "no deepspeed" not in d:  # "single (no DeepSpeed)" is one GPU without it
        knobs = {"zero_stage": case.get("zero_stage") if case.get("zero_stage") is not None else 3}
        offload = ((case.get("offload") or "") + " " + (case.get("source_detail") or "")).lower()
        both = "zero3_offload" in offload or re.search(r"optimizer\s*\+\s*param(eter)?s? to cpu", offload)
        if both or "optimizer->cpu" in offload:
            knobs["offload_optimizer"] = "cpu"
        if both or "param->cpu" in offload:
            knobs["offload_param"] = "cpu"
        return knobs
    if "fsdp" in d:
        offload = "cpu_offload=true" in (case.get("notes") or "").lower().replace(" ", "")
        return {"fsdp_strategy": "full_shard", "fsdp_cpu_offload": offload or None}
    if case.get("distributed") is None:  # unstated: the profile's engine (LitGPT: FSDP on several devices)
        return {}
    return {"engine": "single" if (case.get("num_gpus") or 1) == 1 else "ddp"}


def _seq(case: dict) -> int:
    if case.get("seq_len"):
        return int(case["seq_len"])
    kind = (case.get("seq_len_kind") or "").lower()
    if "tweet" in kind:
        return TWEET_TOKENS
    cut = _torchtune_alpaca_cut(case, kind)
    if cut:
        return cut
    raise Skip("sequence length not stated")


# torchtune's alpaca builders (alpaca_dataset, alpaca_cleaned_dataset) cut every row to max_seq_len = 512 unless the
# config sets one: torchtune/datasets/_alpaca.py from PR #620 (2024-03-30) until PR #1284 (2024-08-15), so in v0.1.0
# to v0.2.1 and at the commits TORCHTUNE_RUNS dates (fef3ed10, ff594c23, 0914d5cf, whose configs set no max_seq_len);
# InstructDataset truncates the tokens to it. Padded to its longest row, a batch then holds at most 512 tokens, and
# alpaca's longest rows pass 512 with the Llama-2 tokenizer: the run's peak batch is a 512-token one (a run that
# never drew such a row peaks lower, and the estimate is then high).
TORCHTUNE_ALPACA_CUT = ("0.1.0.dev20240330", "0.3.0.dev20240815", 512)  # (from, until, tokens)


def _torchtune_alpaca_cut(case: dict, kind: str) -> int | None:
    run = (_versions(case) or {}).get("torchtune")
    packed = "packed" in kind.replace("unpacked", "")
    if case.get("profile") != "torchtune" or "alpaca" not in kind or packed or not run:
        return None
    start, until, tokens = TORCHTUNE_ALPACA_CUT
    return tokens if Version(start) <= Version(run) < Version(until) else None


# fms-acceleration's benchmark refs (foundation-model-stack/fms-acceleration 24bdadb, the CSV's commit 876e2ed,
# scripts/benchmarks/refs/requirements.txt) ran transformers 4.48.1, bitsandbytes 0.43.3, peft 0.13.2, accelerate
# 1.0.1, torch 2.4.1: their own logits, loss and checkpointing, not the pins' (bitsandbytes >= 0.43.2's MatMul4Bit
# keeps no input for backward, which memfit's default already says).
FMS_TRANSFORMERS = "4.48.1"
# FOAK's fast_loss there (plugins/fused-ops-and-kernels models/*.py, transformers >= 4.46): Llama, Mistral and
# Mixtral get a custom loss_type whose ForCausalLMLoss copy calls unsloth's in-place Fast_CrossEntropyLoss;
# GPTBigCode's rule swaps the CrossEntropyLoss name its module imported, which 4.48.1's GPTBigCodeForCausalLM
# forward still calls (modeling_gpt_bigcode.py `loss_fct = CrossEntropyLoss()`; self.loss_function from 4.48.3).
FOAK_INPLACE_CE = ("llama", "mistral", "mixtral", "gpt_bigcode")

# The torchtune each case ran, from the commit or PR its source names (pytorch/torchtune's history): torchtune's main
# on that day, named as the release whose history holds the commit ("0.2.0.dev20240509": main of 2024-05-09, shipped
# in 0.2.0), which selects that release's range of memfit/facts/data/releases.toml. The 2024-05 rows are the README
# table written by PR #955 at 0217d44c on 2024-05-09 (the case cites ca0a6de4, a later commit where the table still
# stood) and PR #961 re-ran its 1-GPU full row on 2024-05-10: main between v0.1.1 (04-18) and v0.2.0 (07-16).
TORCHTUNE_RUNS = {
    "torchtune-lora-tutorial-": "0.1.0.dev20240415",  # ff594c23 (PR #702), in v0.1.0's history
    "torchtune-qlora-tutorial-": "0.1.0.dev20240415",  # 0914d5cf (PR #693), in v0.1.0's history
    "torchtune-readme-2024-04-": "0.1.1.dev20240416",  # fef3ed10 (PR #775), in v0.1.1's history
    "torchtune-readme-2024-05-": "0.2.0.dev20240509",  # 0217d44c (PR #955), in v0.2.0's history
    "torchtune-pr961-": "0.2.0.dev20240510",  # PR #961's description
    "torchtune-readme-2024-09-": "0.3.1.dev20240924",  # 30b8519e (PR #1664), in v0.3.1's history
    "torchtune-readme-optflags-": "0.5.0.dev20241118",  # 1814feb1 (PR #2003), in v0.5.0's history
}


def _fms_seq(seq: int, model) -> int:
    """fms-hf-tuning trains at min(max_seq_length, tokenizer.model_max_length) (tuning/data/setup_dataprocessor.py
    at d3c30a03; the clamp is in since c23cc9b9, 2024-01, before the benchmark). The tokenizer's limit is not in
    config.json: the model's position count stands for it. santacoder: 2048 of the 4096 asked (its learned position
    table has 2048 rows; the CSV's tokens/s over samples/s reads about 2048 tokens per sample too)."""
    return min(seq, model.max_position_embeddings) if model.max_position_embeddings else seq


def _loss(case: dict, model) -> str | None:
    kernels = (case.get("kernels") or "").lower()
    if "foak" in kernels:
        return "inplace_ce" if model.arch in FOAK_INPLACE_CE else None
    return "chunked_output" if "chunked" in kernels else None


def _lora_targets(case: dict) -> tuple[str, ...] | None:
    """Module names out of the case's free text ("q_proj k_proj v_proj o_proj", "q,v,output_proj + MLP") or list."""
    given = case.get("lora_targets") or ""
    text = " ".join(map(str, given)) if isinstance(given, (list, tuple)) else str(given)
    text = text.lower()
    if not text or "all" in text or "default" in text:
        return None
    names = {"output_proj": "o_proj", "q": "q_proj", "k": "k_proj", "v": "v_proj"}
    found = [names.get(w, w) for w in re.findall(r"[a-z_0-9]+", text) if w.endswith("proj") or w in names
             or w in ("c_attn", "query_key_value")]
    if "mlp" in text:
        found += ["gate_proj", "up_proj", "down_proj"]
    return tuple(dict.fromkeys(found)) or None


def _versions(case: dict) -> dict | None:
    """The framework releases a case ran, where its source pins them; None: memfit's pins."""
    if case["id"].startswith("fms-"):
        return {"transformers": FMS_TRANSFORMERS}
    run = next((v for prefix, v in TORCHTUNE_RUNS.items() if case["id"].startswith(prefix)), None)
    return {"torchtune": run} if run else None


def _attention(case: dict) -> str | None:
    """flash_attention_2 -> flash; eager stated -> eager (OpenRLHF <= v0.8 without --flash_attn, docs/knobs.md E.3);
    anything else -> the profile's default."""
    impl = (case.get("attention_impl") or "").lower()
    return "flash" if impl.startswith("flash") else ("eager" if impl.startswith("eager") else None)


def _model_name(case: dict) -> str:
    return re.sub(r"\s*\(.*\)$", "", case["model"]).strip()


# What a case's gradient_checkpointing text means as memfit's --checkpointing (knobs.toml). Unsloth's
# use_gradient_checkpointing="unsloth" is its offloaded checkpointing (memory/unsloth_offload.py), and True is plain
# HF checkpointing there too: unsloth_zoo training_utils.py prepare_model_for_training calls gradient_checkpointing_
# enable for True and undoes unsloth's offload patch for anything but "unsloth" (unsloth_zoo ce232d6c, 2026-08).
def _checkpointing(case: dict) -> str | None:
    said = case.get("gradient_checkpointing")
    if said is None or isinstance(said, bool):
        return {True: "full", False: "off"}.get(said)
    if "unsloth" in said or "offload" in said:
        return "unsloth" if "unsloth" in said or case.get("profile") == "unsloth" else "offload"
    if said in knob("checkpointing").choices:
        return said
    raise Skip(f"gradient_checkpointing {said!r}: not a checkpointing memfit models (it models "
               f"{', '.join(knob('checkpointing').choices)})")


# Counts a case states in its method, notes or source_detail: (knob, patterns; each captures a number, or a
# bracketed list whose items are counted)
STATED_COUNTS = {
    "lora_rank": (r"\binit_r\s*[=:]\s*(\d+)", r"\b(?:lora_)?(?:r|rank)\s*[=:]\s*(\d+)"),
    "virtual_tokens": (r"\bnum_virtual_tokens\s*[=:]\s*(\d+)", r"\bvirtual[ _]tokens\s*[=:]\s*(\d+)",
                       r"(\d+)\s+virtual[ _]tokens"),
    "trainable_tokens": (r"\b(?:trainable_)?token_indices\s*[=:]\s*(\[[^\]]*\])",
                         r"\btrainable[ _]tokens\s*[=:]\s*(\d+)", r"(\d+)\s+trainable[ _]tokens"),
    "freeze_trainable_layers": (r"\bfreeze_trainable_layers\s*[=:]\s*(\d+)",),
}


def _stated(text: str, name: str) -> int | None:
    for pattern in STATED_COUNTS[name]:
        hit = re.search(pattern, text)
        if hit:
            value = hit.group(1)
            return len(re.findall(r"\d+", value)) if value.startswith("[") else int(value) or None
    return None


def _rows_of_hidden(case: dict, model) -> int | None:
    """Embedding rows a PEFT count of trainable parameters stands for: prompt tuning trains [tokens, hidden] and
    trainable tokens a [tokens, hidden] delta (adapters.toml's sources), so the count is rows x hidden exactly."""
    count = str(case.get("trainable_params") or "").replace(",", "").strip()
    if not count.isdigit() or int(count) % model.hidden_size:
        return None
    return int(count) // model.hidden_size or None


# PEFT modules_to_save a case names (in its method, "lora+emb", or its notes): the embedding and the output head as
# memfit's --modules-to-save names them; "emb" alone is both embedding matrices (input and output)
SAVED_MODULES = ((r"embed_tokens|\bwte\b|input embedding", "embed_tokens"),
                 (r"lm_head|output head|\bhead\b", "lm_head"))


def _modules_to_save(text: str) -> tuple[str, ...] | None:
    listed = re.search(r"modules_to_save\s*[=:]?\s*(\[[^\]]*\]|[a-z_, ]+)", text)
    extra = re.search(r"\+\s*([a-z_ ,/&+]+)", text.split(" notes ")[0])  # the method's "+ ..." ("lora+emb")
    said = listed.group(1) if listed else extra.group(1) if extra else None
    if said is None:
        return None
    names = tuple(name for pattern, name in SAVED_MODULES if re.search(pattern, said))
    return names or (("embed_tokens", "lm_head") if "emb" in said else None)


def _adapter_knobs(case: dict, tuning: str, tuning_text: str, model) -> dict:
    """What a case states of its adapters beyond the method: rank, virtual / trainable tokens, modules_to_save."""
    text = f"{tuning_text} notes {case.get('notes') or ''} {case.get('source_detail') or ''}".lower()
    out = {}
    ranked = tuning in ("lora", "qlora") or (tuning in adapter_methods() and not method_info(tuning).get("rankless"))
    if ranked and case.get("lora_rank") is None:
        out["lora_rank"] = _stated(text, "lora_rank")
    if wraps(tuning) == "virtual_tokens":
        out["virtual_tokens"] = _stated(text, "virtual_tokens") or (
            _rows_of_hidden(case, model) if tuning == "prompt" else None)
    if tuning == "trainable_tokens":
        out["trainable_tokens"] = _stated(text, "trainable_tokens") or _rows_of_hidden(case, model)
    elif tuning in ("lora", "qlora") and "trainable_token_indices" in text:
        out["trainable_tokens"] = _stated(text, "trainable_tokens")
    if tuning in ("lora", "qlora") or wraps(tuning) == "linear":
        out["modules_to_save"] = _modules_to_save(text)
    if tuning == "freeze":
        out["freeze_trainable_layers"] = _stated(text, "freeze_trainable_layers")
    return out


def _quant_knobs(case: dict, tuning: str, tuning_text: str) -> tuple[str, dict]:
    """The tuning once the base's quantization is read (LoRA over a quantized base is QLoRA) and its knobs."""
    bits, double = _quant(case, tuning_text)
    if bits is None:
        return tuning, {}
    if tuning == "lora":
        tuning = "qlora"
    if tuning != "qlora":
        raise Skip(f"--tuning {tuning} over a {bits}-bit base is not modeled: memfit quantizes the base only under "
                   "LoRA (--tuning qlora; knobs.toml quant_bits acts only there)")
    return tuning, {"quant_bits": bits, "double_quant": double}


def scenario_for(case: dict):
    if case.get("compile"):
        raise Skip("torch.compile fuses ops and changes what is saved for backward; not modeled")
    model = find_model(_model_name(case))
    if model.encoder_decoder:
        raise Skip("encoder-decoder (T5) activations are not modeled")
    method, tuning_text = _method(case.get("method") or "")
    tuning, quant = _quant_knobs(case, _tuning(tuning_text, case.get("profile")), tuning_text)
    nodes = 2 if "2 nodes" in (case.get("gpu_type") or "") else 1
    gpus = (case.get("num_gpus") or 1) // nodes
    hardware = Hardware(gpu=_gpu(case), gpus_per_node=gpus, nodes=nodes)
    optimizer, in_bwd = _optimizer(case)
    knobs = {
        "tuning": tuning, "precision": _precision(case, tuning, bool(quant)), "optimizer": optimizer,
        "micro_batch": case.get("micro_batch_size") or 1, "seq_len": _seq(case),
        "grad_accum": case.get("grad_accum") or 1, "lora_rank": case.get("lora_rank"),
        "lora_targets": _lora_targets(case),
        "checkpointing": _checkpointing(case),
        "attention": _attention(case),
        "padding": "packed" if re.search(r"\bpacked", case.get("seq_len_kind") or "") else None,
        "loss": _loss(case, model),
        "optimizer_in_backward": in_bwd or None,
        "method": None if method == "sft" else method,
        **_engine(case), **quant, **_adapter_knobs(case, tuning, tuning_text, model),
    }
    precision_text = (case.get("precision") or "").lower()
    if "no autocast" in precision_text or "mixed_precision 'no'" in precision_text:
        knobs["autocast"] = False
    elif "autocast" in precision_text:
        knobs["autocast"] = True
    if "framework_config=accelerated-peft" in (case.get("source_detail") or ""):
        knobs["kbit_upcast"] = False  # the fms plugin prepares the quantized model itself, without PEFT's upcast
    if re.search(r"\bq?dora\b", _words(case.get("method"))):
        knobs["dora"] = True
    if case["id"].startswith("fms-"):
        knobs["seq_len"] = _fms_seq(knobs["seq_len"], model)
    return build_scenario(model, hardware, knobs, case.get("profile") or "hf-trainer", versions=_versions(case))


UNIT_BYTES = {"b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "kib": 2**10, "mb": 1e6, "mib": 2**20, "gb": 1e9, "gib": 2**30,
              "tb": 1e12, "tib": 2**40}


def _unit_bytes(case: dict) -> float:
    """The case's unit, in any case ("GiB", "gib", "GiB allocated at OOM"); unstated or unknown: GB as most sources."""
    unit = (case.get("measured_unit") or "").lower()
    if "torchtune" in unit:  # torchtune logs GiB whatever the source wrote beside the number
        return 2**30
    word = re.match(r"\s*([a-z]+)", unit)
    return UNIT_BYTES.get(word.group(1), 1e9) if word else 1e9


def _case_id(case) -> str:
    """A row's name even when its id is missing or unreadable."""
    if isinstance(case, BadLine):
        return f"(line {case.line})"
    if isinstance(case, dict) and isinstance(case.get("id"), (str, int)) and not isinstance(case.get("id"), bool):
        return str(case["id"])
    return "(no id)"


def evaluate(case: dict) -> Row:
    """One case: predicted vs measured on its basis, or skipped with the reason (never an exception)."""
    try:
        case = normalize(case)
    except Skip as e:
        return Row({"id": _case_id(case)}, skip=str(e))
    row = Row(case)
    try:
        s = scenario_for(case)
        est = estimate(s) if not several_models(s.method) else estimate(s)
    except (Skip, MemfitError) as e:
        row.skip = str(e)
        return row
    basis = case.get("basis")
    row.peak_phase = est.peak_phase
    row.predicted_label = "oom" if est.verdict == "oom" else ("host_oom" if est.verdict == "host_oom" else "fits")
    outcome = {"fits_at_max": "fits"}.get(case.get("outcome"), case.get("outcome"))
    if outcome in ("fits", "oom", "host_oom"):
        row.label_ok = row.predicted_label == outcome
    if basis in NUMERIC_BASES and case.get("measured_value") is not None:
        scale = (case.get("num_gpus") or 1) if case.get("value_scope") == "aggregate" else 1
        row.measured = case["measured_value"] * _unit_bytes(case) / scale
        row.predicted = getattr(est, BASIS_PROFILE[basis]).peak.total
    return row


def _accuracy(rows: list[Row]) -> dict:
    numeric = [r for r in rows if r.error_pct is not None and r.case.get("reliability") in ("high", "medium")]
    errs = sorted(abs(r.error_pct) for r in numeric)
    labels = [r for r in rows if r.label_ok is not None]
    return {
        "n_numeric": len(numeric),
        "median_abs_pct_error": round(statistics.median(errs), 2) if errs else None,
        "p90_abs_pct_error": round(errs[min(len(errs) - 1, int(0.9 * len(errs)))], 2) if errs else None,
        "n_labels": len(labels),
        "label_accuracy": round(sum(r.label_ok for r in labels) / len(labels), 4) if labels else None,
        # the runs memfit would have sent to a crash (said fits, measured more), and the other side
        "under_10pct_share": round(sum(r.error_pct < -10 for r in numeric) / len(numeric), 4) if numeric else None,
        "over_10pct_share": round(sum(r.error_pct > 10 for r in numeric) / len(numeric), 4) if numeric else None,
    }


# issue 11's bar for the published cases: (summary key, target, met when the value is at most / at least it)
TARGETS = (("median_abs_pct_error", 5.0, "max"), ("p90_abs_pct_error", 20.0, "max"),
           ("oom_recall", 0.95, "min"), ("under_10pct_share", 0.05, "max"))


def targets(summary: dict) -> dict:
    out = {}
    for key, target, side in TARGETS:
        value = summary.get(key, summary["verdicts"].get(key))
        met = value is not None and (value <= target if side == "max" else value >= target)
        out[key] = {"value": value, "target": f"{'<=' if side == 'max' else '>='} {target:g}", "met": met}
    return out


def _is_moe(case: dict) -> bool:
    if not isinstance(case.get("model"), str):  # a skipped row keeps only its id
        return False
    try:
        return find_model(_model_name(case)).is_moe
    except MemfitError:
        return False


def _verdict_rules(rows: list[Row]) -> dict:
    """The verdicts of the cases with a real outcome under the old rule (a fixed 5% of the card: the card floor
    with no band) and the error bands: OOM recall (called "oom"), real OOMs warned of (not called "fits"), real
    OOMs called "fits", and real fits called "tight". A check of the bands, never an input to them."""
    from memfit.memory.phases import verdict_of

    seen = {"old_5pct": {"oom_called_fits": 0, "oom_warned": 0, "fits_called_tight": 0},
            "bands": {"oom_called_fits": 0, "oom_warned": 0, "fits_called_tight": 0}}
    n_oom = n_fits = oom_called_oom = 0
    for r in rows:
        outcome = {"fits_at_max": "fits"}.get(r.case.get("outcome"), r.case.get("outcome"))
        if r.skip or outcome not in ("fits", "oom"):
            continue
        e = estimate(scenario_for(r.case))
        old = verdict_of(e.margin_bytes, e.scenario.hardware.gpu.memory_bytes, e.host_margin_bytes, 0.0)
        n_oom, n_fits, oom_called_oom = n_oom + (outcome == "oom"), n_fits + (outcome == "fits"), \
            oom_called_oom + (outcome == "oom" and e.verdict == "oom")
        for rule, verdict in (("old_5pct", old), ("bands", e.verdict)):
            seen[rule]["oom_called_fits"] += outcome == "oom" and verdict == "fits"
            seen[rule]["oom_warned"] += outcome == "oom" and verdict != "fits"
            seen[rule]["fits_called_tight"] += outcome == "fits" and verdict == "tight"
    for rule in seen.values():
        rule["oom_warned_recall"] = round(rule.pop("oom_warned") / n_oom, 4) if n_oom else None
    return {"n_real_oom": n_oom, "n_real_fits": n_fits,
            "oom_recall": round(oom_called_oom / n_oom, 4) if n_oom else None, **seen}


def summarize(rows: list[Row]) -> dict:
    skipped = [r for r in rows if r.skip]
    reasons: dict[str, int] = {}
    for r in skipped:
        reasons[r.skip] = reasons.get(r.skip, 0) + 1
    # mixture-of-experts cases are held to the same bar as the whole set, so they get their own line
    moe = _accuracy([r for r in rows if _is_moe(r.case)])
    return {**_accuracy(rows), "n_skipped": len(skipped), "skipped_reasons": reasons, "moe": moe,
            "verdicts": _verdict_rules(rows)}


def print_rows(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="published cases: memfit vs measured (GiB)")
    for col in ("id", "basis", "measured", "memfit", "err %", "peak phase", "label", "memfit label"):
        table.add_column(col)
    for r in rows:
        c = r.case
        if r.skip:
            table.add_row(c["id"], c.get("basis") or "", "", "", "", "", c.get("outcome") or "", f"skip: {r.skip}")
            continue
        err = r.error_pct
        table.add_row(c["id"], c.get("basis") or "",
                      f"{r.measured / 2**30:.2f}" if r.measured else "", f"{r.predicted / 2**30:.2f}" if r.predicted else "",
                      f"{err:+.1f}" if err is not None else "", r.peak_phase, c.get("outcome") or "",
                      (r.predicted_label or "") + ("" if r.label_ok in (None, True) else " (wrong)"))
    show(Console(), table)


def read_cases(path: Path) -> list:
    """One case per non-blank line; a line that is not JSON becomes a case `evaluate` skips with the reason."""
    cases = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                cases.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError, ValueError) as e:
                cases.append(BadLine(n, str(e).split(":")[0]))
    return cases


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=str(PUBLISHED))
    p.add_argument("--summary-json", action="store_true")
    a = p.parse_args()
    try:
        cases = read_cases(Path(a.cases))
    except (OSError, UnicodeDecodeError) as e:
        print(f"published.py: error: cannot read cases {a.cases!r}: {e}", file=sys.stderr)
        return 2
    rows = [evaluate(c) for c in cases]
    summary = summarize(rows)
    summary |= {"targets": targets(summary), "versions": installed()}
    if a.summary_json:
        print(json.dumps(summary))
    else:
        print_rows(rows)
        print(json.dumps(summary, indent=2))
        for key, t in summary["targets"].items():
            print(f"{key:<22} {t['value']!s:>8}  target {t['target']:<8} {'met' if t['met'] else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
