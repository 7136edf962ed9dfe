"""A framework that runs its own model code, training loop and loss (LitGPT), as its profile's [model_code] says.

Logits and loss: the traced [model_code.logits.KIND] rows (memfit/trace/litgpt_facts.py derives them).

Each row gives [bytes per token x vocabulary, bytes per chunk row x vocabulary] for: the forward peak, what is
saved at the end of forward, the backward peak, and `kept`: the loop's own reference to the logits, alive from
one forward to the next (so it is there through backward, the optimizer step and the next forward's layers).
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.facts.frameworks import model_code
from memfit.facts.scenario import Scenario


@dataclass(frozen=True)
class CodeLogits:
    forward_peak: int
    saved: int
    backward_peak: int
    kept: int
    grad: int  # alive while the head computes its weight gradient: the kept logits and their 16-bit gradient


def code_logits(s: Scenario, n: int, v: int) -> CodeLogits | None:
    """None when the profile runs the transformers modeling code (no [model_code.logits])."""
    code = model_code(s.profile)
    rows = code.get("logits")
    # traced on bf16-true, LitGPT's own loss (the loss knob at its default) and supervised fine-tuning
    if not rows or s.precision != "bf16-pure" or s.loss != "standard" or s.method != "sft":
        return None
    kind = "full" if s.trains_whole("lm_head") else "chunked"  # full.py runs the head unchunked
    if kind == "full" and s.micro_batch > 1:  # its shifting slice is copied by the loss's reshape
        kind = "full_batched"
    row = rows[kind]
    # lm_head_chunk_size splits the sequence: a chunk is that many positions of every row of the micro-batch
    chunk = min(s.seq_len, code["head_chunk"]) * s.micro_batch if kind == "chunked" else 0

    def of(name: str) -> int:
        per_token, per_chunk_row = row[name]
        return int(per_token * n * v + per_chunk_row * chunk * v)

    kept = of("kept")
    return CodeLogits(of("forward_peak"), of("saved"), of("backward_peak"), kept,
                      kept + (n * v * s.compute_bytes if kind == "full" else 0))


def fused_qkv(s: Scenario, b: int, adapted: dict[str, tuple[int, float]]) -> int:
    """Bytes per token one decoder layer saves beyond the transformers-shaped count, for a model code with one fused
    qkv Linear (LitGPT CausalSelfAttention.qkv, lora.py LoRAQKVLinear; [model_code] fused_qkv, traced):
    - without k/v expansion (as many kv heads as heads) v is a view of the fused output: the attention kernel's
      saved v keeps the whole q+k+v output alive;
    - LoRA on it keeps its B output (the adapted parts' widths) and drops its input once, for every part (one
      bool mask where per-module LoRA has one per adapted module)."""
    if not model_code(s.profile).get("fused_qkv"):
        return 0
    m = s.model
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    extra = b * (q + kv) if m.num_kv_heads == m.num_heads else 0
    parts = [roles for mod, roles in m.linear_names.items() if mod in adapted and set(roles) & {"q", "k", "v"}]
    if parts and s.tuning in ("lora", "qlora"):
        extra += b * sum(q if "q" in roles else kv for roles in parts)
        if s.lora_dropout > 0:
            extra -= (len(parts) - 1) * m.hidden_size
    return extra


def head_casts(s: Scenario) -> int:
    """16-bit copies autocast makes of a frozen fp32 output head: one per call, and LitGPT's chunked head
    (lm_head_chunk_size) calls it once per chunk of positions, each chunk's matmul saving its own copy for backward
    (autocast caches no cast of a weight that needs no gradient; traced on bf16-mixed LoRA)."""
    chunk = model_code(s.profile).get("head_chunk")
    return -(-s.seq_len // chunk) if chunk and not s.trains_whole("lm_head") else 1
