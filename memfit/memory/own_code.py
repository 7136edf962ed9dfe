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
from memfit.memory.inventory import prompt_adapter


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
    # traced on bf16-true, LitGPT's own loss (the loss knob at its default) and supervised fine-tuning; bf16-mixed
    # makes the same logits (autocast's head output is bf16, Fabric's convert_output casts it to fp32 under either;
    # measured the same on 2 ranks, bench/litgpt_distributed.py); its head's weight casts are counted with the states
    if not rows or s.precision not in ("bf16-pure", "bf16-mixed") or s.loss != "standard" or s.method != "sft":
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
    qkv Linear (LitGPT CausalSelfAttention.qkv, lora.py LoRAQKVLinear; [model_code] fused_qkv, traced): LoRA on it
    keeps its B output (the adapted parts' widths) and drops its input once, for every part (one bool mask where
    per-module LoRA has one per adapted module). (The saved v that keeps the whole fused output alive is counted
    with the attention: fused_qkv_rest.)"""
    if not model_code(s.profile).get("fused_qkv"):
        return 0
    m = s.model
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    extra = 0
    parts = [roles for mod, roles in m.linear_names.items() if mod in adapted and set(roles) & {"q", "k", "v"}]
    if parts and s.tuning in ("lora", "qlora"):
        extra += b * sum(q if "q" in roles else kv for roles in parts)
        if s.lora_dropout > 0:
            extra -= (len(parts) - 1) * m.hidden_size
    return extra


def scaled_head(s: Scenario, n: int, v: int) -> int:
    """LLaMA-Adapter v2 scales the head's output: each chunk's product saves the unscaled logits, fp32 when the
    model was built in fp32 (its scale and bias promote autocast's 16-bit output; traced)."""
    if not prompt_adapter(s).get("scaled_linears"):
        return 0
    return n * v * (4 if s.frozen_fp32_in_module else s.compute_bytes)


def head_casts(s: Scenario) -> int:
    """16-bit copies autocast makes of a frozen fp32 output head: one per call, and LitGPT's chunked head
    (lm_head_chunk_size) calls it once per chunk of positions, each chunk's matmul saving its own copy for backward
    (autocast caches no cast of a weight that needs no gradient; traced on bf16-mixed LoRA)."""
    chunk = model_code(s.profile).get("head_chunk")
    return -(-s.seq_len // chunk) if chunk and not s.trains_whole("lm_head") else 1


def fused_qkv_rest(s: Scenario, b: int, masked: bool) -> int:
    """Bytes per token of one fused qkv output that stay saved because the SDPA kernel's saved v is a view of it
    (traced): a transformers family that splits it with views (GPT-NeoX), or a framework's own fused qkv (LitGPT)
    with as many kv heads as heads (else k, v are expanded copies). Eager's PV matmul reshapes v into a contiguous
    copy and torch's math kernel saves fp32 copies (traced: neither keeps it); flash is assumed to keep it. With fewer
    kv heads, a masked SDPA call gets repeat_kv's copies of k and v (traced on phi3 with 4 of 12)."""
    m = s.model
    own = model_code(s.profile).get("fused_qkv") and m.num_kv_heads == m.num_heads
    if not (m.sdpa_v_view or own) or s.attention == "eager" or s.attention == "sdpa" and m.sdpa_math:
        return 0
    if s.attention == "sdpa" and masked and m.num_kv_heads != m.num_heads:
        return 0
    return b * (m.num_heads + m.num_kv_heads) * m.head_dim


def prompt_layers(s: Scenario) -> int | None:
    """Layers that save activations under LLaMA-Adapter: all with v2 (layer 0's norm trains), else the prompted
    ones (no gradient reaches the layers below the first prompt). None under any other tuning."""
    code = prompt_adapter(s)
    if not code:
        return None
    return s.model.num_layers if code["scaled_linears"] else s.model.num_layers - code["start_layer"]


def prompt_layer_extra(s: Scenario, b: int, attention: int, first_norm: int) -> int:
    """Bytes per token a layer saves under LLaMA-Adapter beyond a frozen layer's, averaged over prompt_layers
    (traced, litgpt 0.5.13). A prompted layer: the prompt attention's output (the gate's product saves it), its
    fp32 log-sum-exp and its (token x prompt) bias, padded to 16. v1: the lowest prompted layer's own attention and
    first norm save nothing (no gradient flows below it). v2: each Linear's product saves linear(x) + bias (traced on
    bf16-true and bf16-mixed)."""
    code = prompt_adapter(s)
    if not code:
        return 0
    m = s.model
    prompted = max(m.num_layers - code["start_layer"], 0)
    total = prompted * (b * m.num_heads * m.head_dim + 4 * m.num_heads + b * -(-code["prompt_length"] // 16) * 16)
    if code["scaled_linears"]:
        # a model built in fp32 (bf16-mixed) has fp32 scales and biases: under autocast they promote every Linear's
        # output, and so the MLP's intermediates, to fp32; the prompt's attention casts q to 16 bit once more
        ob = 4 if s.frozen_fp32_in_module else b
        ffn = m.intermediate_size * (3 if m.mlp == "gated" else 1) if not m.is_moe else 0
        total += m.num_layers * (ob * _linear_outputs(s) + (ob - b) * ffn)
        total += prompted * b * m.num_heads * m.head_dim if ob != b else 0
    else:
        total -= attention + first_norm
    return -(-total // prompt_layers(s))


def _linear_outputs(s: Scenario) -> int:
    """Output widths one token meets in a layer's Linears: attention (q, k, v, o) and the MLP (routed experts'
    per chosen expert, and the router)."""
    m = s.model
    attn = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim + m.hidden_size
    ffn = m.moe_intermediate_size or m.intermediate_size if m.is_moe else m.intermediate_size
    mlp = (2 * ffn if m.mlp == "gated" else ffn) + m.hidden_size
    return attn + (m.experts_per_token * mlp + m.num_experts if m.is_moe else mlp)
