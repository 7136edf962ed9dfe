"""The accuracy grid (bench/accuracy.py): single-GPU runs of catalog models, and the DPO and MoE rows beside
them. Each row is a Scenario built the way the command line builds one."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from memfit.facts.catalog import ModelSpec, find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware, Scenario

GPU_ID = "a100-80gb"


@dataclass(frozen=True)
class GridRow:
    """One configuration. `model` is a catalog name, or a ModelSpec (tests use tiny ones)."""

    label: str  # short model name for the row id
    model: str | ModelSpec
    tuning: str = "full"
    checkpointing: str = "off"
    attention: str = "sdpa"
    micro_batch: int = 1
    seq_len: int = 512
    precision: str = "bf16-pure"
    optimizer: str = "adamw-foreach"
    lora_rank: int = 16
    padding: str | None = None  # None = the hf-trainer default (padded)
    method: str = "sft"  # dpo: OpenRLHF's DPO step (policy + reference, chosen + rejected rows)
    trainable_tokens: int = 0  # PEFT trainable tokens: embedding rows that train (alone, or beside LoRA)
    quant_bits: int = 4  # qlora: the bitsandbytes base, 4-bit NF4 or 8-bit LLM.int8

    @property
    def id(self) -> str:
        tuning = f"{self.tuning}{self.lora_rank}" if self.ranked else self.tuning
        if self.trainable_tokens:  # the rows that train: trainable_tokens64, lora16-tokens64
            tuning += f"{'' if self.tuning == 'trainable_tokens' else '-tokens'}{self.trainable_tokens}"
        tuning += "-int8" if self.quant_bits == 8 else ""
        ckpt = "ckpt" if self.checkpointing != "off" else "nockpt"
        opt = self.optimizer.removeprefix("adamw-")
        pad = f"/{self.padding}" if self.padding else ""
        method = "" if self.method == "sft" else f"{self.method}/"
        return (f"{method}{self.label}/{tuning}/{self.precision}/{opt}/{self.attention}/{ckpt}/"
                f"b{self.micro_batch}x{self.seq_len}{pad}")

    @property
    def ranked(self) -> bool:
        return self.tuning in ("lora", "vera", "adalora", "loha", "lokr")

    @property
    def profile(self) -> str:
        return "hf-trainer" if self.method == "sft" else "openrlhf"  # the layout the DPO trace runs

    def knobs(self) -> dict:
        knobs = {"engine": "single", "tuning": self.tuning, "precision": self.precision,
                 "optimizer": self.optimizer, "checkpointing": self.checkpointing, "attention": self.attention,
                 "micro_batch": self.micro_batch, "seq_len": self.seq_len, "padding": self.padding}
        if self.ranked:
            knobs["lora_rank"] = self.lora_rank
        if self.method != "sft":
            knobs["method"] = self.method
        if self.trainable_tokens:
            knobs["trainable_tokens"] = self.trainable_tokens
        if self.quant_bits != 4:
            knobs["quant_bits"] = self.quant_bits
        return knobs

    def scenario(self) -> Scenario:
        spec = find_model(self.model) if isinstance(self.model, str) else self.model
        hardware = Hardware(gpu=find_gpu(GPU_ID), gpus_per_node=1)
        return build_scenario(spec, hardware, self.knobs(), self.profile)


ALL_ATTENTION = ("eager", "sdpa", "flash")
# (label, catalog name, attention implementations the trace runs for it)
SMALL_MODELS = (
    ("llama3.2-1b", "meta-llama/Llama-3.2-1B", ALL_ATTENTION),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", ALL_ATTENTION),
    ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", ALL_ATTENTION),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", ALL_ATTENTION),
    ("gemma2-2b", "google/gemma-2-2b", ("eager",)),  # transformers refuses sdpa for gemma2 (softcapping)
    ("santacoder", "bigcode/gpt_bigcode-santacoder", ALL_ATTENTION),
    ("starcoder2-3b", "bigcode/starcoder2-3b", ALL_ATTENTION),
    ("phi3-mini", "microsoft/Phi-3-mini-4k-instruct", ALL_ATTENTION),
)
BIG_MODELS = (
    ("llama3.1-8b", "meta-llama/Llama-3.1-8B", ("sdpa", "flash")),
    ("mistral-7b", "mistralai/Mistral-7B-v0.1", ("sdpa", "eager")),
    ("qwen2.5-7b", "Qwen/Qwen2.5-7B", ("flash", "eager")),
    ("qwen3-8b", "Qwen/Qwen3-8B", ("sdpa", "flash")),
    ("glm4-9b", "THUDM/glm-4-9b-chat-hf", ("sdpa", "eager")),
)
MOE_MODELS = (("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", ("sdpa", "flash")),)
# (micro-batch, sequence length) rotations: every size from 512 to 8192, batches 1, 2, 4
SMALL_SHAPES = ((1, 512), (2, 1024), (4, 512), (1, 2048), (2, 2048), (1, 4096), (4, 1024), (2, 512),
                (1, 1024), (4, 2048), (1, 8192), (2, 4096))
BIG_SHAPES = ((1, 2048), (2, 1024), (4, 2048), (1, 4096), (1, 8192), (2, 2048), (4, 1024), (1, 512))


def _pick(options: tuple, *key) -> object:
    """A fixed, well-mixed choice (so precision/optimizer do not line up with the other axes)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return options[digest[0] % len(options)]


def _row(label, name, tuning, ckpt, attn, shape, **extra) -> GridRow:
    key = (label, tuning, ckpt, attn, shape)
    precision = extra.pop("precision", None) or _pick(("bf16-pure", "bf16-mixed"), "precision", *key)
    optimizer = extra.pop("optimizer", None) or _pick(("adamw-foreach", "adamw-fused"), "optimizer", *key)
    rank = extra.pop("lora_rank", None) or _pick((8, 16, 64), "rank", *key)
    return GridRow(label, name, tuning, ckpt, attn, shape[0], shape[1], precision, optimizer, rank, **extra)


def grid() -> list[GridRow]:
    rows: list[GridRow] = []
    for m, (label, name, attns) in enumerate(SMALL_MODELS):
        core = [(t, c, a) for t in ("full", "lora") for c in ("off", "full") for a in attns]
        for i, (tuning, ckpt, attn) in enumerate(core):
            rows.append(_row(label, name, tuning, ckpt, attn, SMALL_SHAPES[(i + 5 * m) % len(SMALL_SHAPES)]))
        sweep_attn = "sdpa" if "sdpa" in attns else attns[0]
        fast_attn = "flash" if "flash" in attns else attns[0]
        rows += [
            _row(label, name, "full", "full", sweep_attn, (4, 4096)),
            _row(label, name, "lora", "off", sweep_attn, (1, 8192)),
            _row(label, name, "lora", "full", fast_attn, (4, 8192)),
            _row(label, name, "full", "off", attns[0], (2, 2048), padding="packed"),
        ]
    for m, (label, name, attns) in enumerate(BIG_MODELS):
        core = [(t, c, a) for t in ("full", "lora") for c in ("off", "full") for a in attns]
        for i, (tuning, ckpt, attn) in enumerate(core):
            rows.append(_row(label, name, tuning, ckpt, attn, BIG_SHAPES[(i + 3 * m) % len(BIG_SHAPES)]))
    for label, name, attns in MOE_MODELS:
        # MoE full tuning runs bf16-pure: transformers' grouped_mm experts need bf16 weights
        rows += [
            _row(label, name, "lora", "full", attns[0], (1, 4096)),
            _row(label, name, "lora", "off", attns[1], (2, 1024)),
            _row(label, name, "full", "full", attns[1], (1, 2048), precision="bf16-pure"),
            _row(label, name, "full", "off", attns[0], (1, 512), precision="bf16-pure"),
        ]
    seen: set[str] = set()
    unique = []
    for r in rows:
        if r.id not in seen:
            seen.add(r.id)
            unique.append(r)
    return unique


# Rows outside the 162-row SFT scoreboard (`grid()`), so its summary stays comparable over time.
# DPO: OpenRLHF's step on one GPU (2 x micro-batch rows; a separate bf16 reference, LoRA or not).
DPO_MODELS = (
    ("llama3.2-1b", "meta-llama/Llama-3.2-1B", ("sdpa", "eager")),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", ("sdpa", "flash")),  # flash: OpenRLHF's default attention
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", ("sdpa", "eager")),
)
DPO_SHAPES = ((1, 512), (2, 2048), (2, 512), (1, 2048))  # (preference pairs per micro-batch, tokens per row)
# more MoE families: transformers' grouped experts; full tuning runs bf16-pure (see MOE_MODELS)
MORE_MOE_MODELS = (("qwen1.5-moe", "Qwen/Qwen1.5-MoE-A2.7B"), ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B"))


def dpo_grid() -> list[GridRow]:
    rows = []
    for m, (label, name, attns) in enumerate(DPO_MODELS):
        core = [(t, c, a) for t in ("full", "lora") for c in ("off", "full") for a in attns]
        for i, (tuning, ckpt, attn) in enumerate(core):
            rows.append(_row(label, name, tuning, ckpt, attn, DPO_SHAPES[(i + m) % len(DPO_SHAPES)], method="dpo"))
    for label, name in MORE_MOE_MODELS:
        rows.append(_row(label, name, "full", "full", "sdpa", (1, 1024), precision="bf16-pure", method="dpo"))
    return rows


def moe_grid() -> list[GridRow]:
    """MoE families beyond the grid's Mixtral."""
    rows = []
    for label, name in MORE_MOE_MODELS:
        rows += [
            _row(label, name, "lora", "full", "sdpa", (1, 2048)),
            _row(label, name, "full", "full", "sdpa", (1, 2048), precision="bf16-pure"),
            _row(label, name, "full", "off", "flash", (2, 1024), precision="bf16-pure"),
        ]
    return rows


# PEFT methods besides LoRA (data/adapters.toml), each with PEFT's default targets under the hf-trainer profile
# (autocast over fp32 adapters)
PEFT_METHODS = ("ia3", "vera", "adalora", "loha", "lokr", "oft", "boft", "prompt", "ptuning", "ln_tuning",
                "trainable_tokens")
# PEFT trainable tokens: 64 rows (PEFT has no default); LoRA with them as LoraConfig trainable_token_indices
TOKEN_ROWS = 64
PEFT_RUNS = (("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "off", "sdpa", (2, 1024)),
             ("llama3.2-1b", "meta-llama/Llama-3.2-1B", "full", "eager", (1, 2048)),
             ("mistral-7b", "mistralai/Mistral-7B-v0.1", "full", "sdpa", (2, 4096)))


def peft_grid() -> list[GridRow]:
    rows = [_row(label, name, method, ckpt, attn, shape,
                 **({"trainable_tokens": TOKEN_ROWS} if method == "trainable_tokens" else {}))
            for method in PEFT_METHODS for label, name, ckpt, attn, shape in PEFT_RUNS]
    return rows + [_row(label, name, "lora", ckpt, attn, shape, trainable_tokens=TOKEN_ROWS)
                   for label, name, ckpt, attn, shape in PEFT_RUNS[:2]]


def quantized_grid() -> list[GridRow]:
    """LoRA over a bitsandbytes base, 4-bit NF4 and 8-bit LLM.int8 (trace/quant.py's stand-ins): the PEFT group's
    runs, bf16 mixed (HF Trainer's bf16 over a bf16 load, PEFT's k-bit upcast)."""
    return [_row(label, name, "qlora", ckpt, attn, shape, quant_bits=bits, precision="bf16-mixed")
            for bits in (4, 8) for label, name, ckpt, attn, shape in PEFT_RUNS]


def all_rows() -> list[GridRow]:
    return grid() + moe_grid() + dpo_grid() + peft_grid() + quantized_grid()


def is_moe(row: GridRow) -> bool:
    spec = find_model(row.model) if isinstance(row.model, str) else row.model
    return spec.is_moe


GROUPS = {"dpo": lambda r: r.method != "sft", "moe": is_moe, "peft": lambda r: r.tuning in PEFT_METHODS or r.trainable_tokens > 0,
          "qlora": lambda r: r.tuning == "qlora"}  # group summaries printed beside the SFT grid's


def quick_grid() -> list[GridRow]:
    """About 20 rows: every 8th row of the grid (the grid interleaves models, tunings and attentions)."""
    return grid()[::8]


def select(rows: list[GridRow], pattern: str | None) -> list[GridRow]:
    """--rows: comma-separated alternatives; each a '+'-joined set of substrings that must all occur."""
    if not pattern:
        return rows
    alternatives = [[p for p in alt.split("+") if p] for alt in pattern.split(",") if alt]
    return [r for r in rows if any(all(p in r.id for p in parts) for parts in alternatives)]
