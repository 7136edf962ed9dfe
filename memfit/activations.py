"""Activation and logits/loss bytes of one micro-batch, from what the HF modeling code saves for backward.

Source: ../shared/reference/knobs.md C (read from transformers' modeling_llama.py, sdpa_attention.py,
masking_utils.py, loss_utils.py; TRL's chunked loss; Liger's fused linear cross entropy), D (PEFT).
Every term is "bytes per token" (or per token x key for attention scores) times the token count.
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.dtypes import BYTES
from memfit.inventory import ParamTensor
from memfit.scenario import Scenario

LIGER_CHUNK_ROUND = 2  # chunk rows are rounded to a power of two: at most 2x n_tok*h logits per chunk
TRL_CHUNK_TOKENS = 256  # trl sft_trainer _CHUNKED_LM_HEAD_CHUNK_SIZE
TORCHTUNE_CHUNKS = 8  # torchtune CEWithChunkedOutputLoss num_output_chunks


@dataclass
class Activations:
    """Bytes of activations for one micro-batch on one rank."""

    layer_saved: int  # what one un-checkpointed decoder layer keeps for backward
    layer_checkpoint: int  # what one checkpointed layer keeps (its input)
    checkpointed_layers: int
    plain_layers: int
    outside_layers: int  # saved by embedding, final norm, lm_head input
    shared_masks: int  # attention masks built once per forward and shared by the layers
    layer_forward_transient: int  # peak temporaries inside one layer's forward
    layer_backward_transient: int  # gradient temporaries while one layer runs backward
    logits_forward_peak: int
    logits_saved: int
    logits_backward_peak: int
    host_offloaded: int = 0  # checkpoints kept in host RAM (offloaded / unsloth checkpointing)

    @property
    def saved_total(self) -> int:
        return (self.layer_saved * self.plain_layers + self.layer_checkpoint * self.checkpointed_layers
                + self.outside_layers + self.shared_masks)

    @property
    def recompute(self) -> int:
        """A checkpointed layer recomputes its whole saved set during backward."""
        return self.layer_saved if self.checkpointed_layers else 0


def residual_bytes(s: Scenario) -> int:
    """dtype of the residual stream: fp32 when the embedding weight is fp32 (an fp32 run, an fp32
    trainable embedding under autocast, or PEFT's kbit upcast), else the compute dtype."""
    if s.precision == "fp32":
        return 4
    if s.tuning == "qlora" and s.kbit_upcast:
        return 4
    fp32_master_in_module = s.precision.endswith("mixed") and s.engine != "deepspeed"
    return 4 if fp32_master_in_module and s.tuning == "full" else s.compute_bytes


def _attention_per_token(s: Scenario, b: int) -> tuple[int, int, int]:
    """(saved bytes per token, saved bytes per token per key position, transient per token per key)."""
    m = s.model
    q = m.num_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    lse = 4 * m.num_heads
    masked = s.padding == "padded" and s.micro_batch > 1
    if s.attention == "flash":
        return b * (q + 2 * kv + q) + lse, 0, 0  # q, k, v, out (already [B,T,H,d]), logsumexp
    repeated = q if m.num_kv_heads != m.num_heads else kv
    if s.attention == "sdpa" and not masked:
        return b * (q + 2 * kv + q + q) + lse, 0, 0  # + contiguous copy of out for o_proj
    if s.attention == "sdpa":
        return b * (q + 2 * repeated + q + q) + lse, 0, 0  # mem-efficient kernel, repeat_kv materialized
    # eager: q and repeated k for QK^T, fp32 softmax output and its bf16 cast for PV, repeated v
    per_key_saved = m.num_heads * (4 + b)
    per_key_transient = m.num_heads * (b + b + 4)  # scores, masked scores, fp32 softmax in flight
    return b * (q + 3 * repeated + q), per_key_saved, per_key_transient


def _lora_per_token(s: Scenario, adapters: list[ParamTensor]) -> int:
    """PEFT casts each adapted Linear's input to the adapter dtype (a copy when they differ) and
    lora_B saves lora_A's rank-wide output (peft/tuners/lora/layer.py Linear.forward)."""
    if not adapters:
        return 0
    ab = BYTES[s.adapter_dtype] if s.precision != "fp32" else 4
    cast = ab != s.compute_bytes and not s.precision.endswith("mixed")
    layers = max(s.model.num_layers, 1)
    total = 0
    for t in adapters:
        if not t.name.endswith("lora_A") or not t.per_layer:
            continue
        per_layer_count = t.count / layers
        if ".experts." in t.name:  # an expert sees only the tokens routed to it
            per_layer_count *= s.model.experts_per_token / s.model.num_experts
        rank = t.out_features
        total += per_layer_count * (rank * ab + (t.in_features * ab if cast else 0))
        if s.lora.dropout > 0:
            total += per_layer_count * t.in_features * (1 + s.compute_bytes)  # mask + dropped input
    return int(total)


def _layer_per_token(s: Scenario, b: int, rb: int, adapters) -> int:
    m = s.model
    h, ffn = m.hidden_size, m.intermediate_size
    if m.is_moe:
        ffn = (m.moe_intermediate_size or ffn) * m.experts_per_token
    norm = {"rms": 4 * h + b * h, "layer": rb * h + 8, "none": rb * h}[m.norm]
    norms = norm * m.norms_per_layer
    linear_inputs = b * h * (2 if m.attention == "mha" else 1)  # qkv input, MLP input (shared when parallel)
    attn, _, _ = _attention_per_token(s, b)
    mlp = b * ffn * (4 if m.mlp == "gated" else 2)
    if m.qk_norm != "none":
        attn += (4 + b) * (m.num_heads + m.num_kv_heads) * m.head_dim
    if m.is_moe:
        mlp += m.experts_per_token * 2 * b * h + 4 * m.num_experts * 2  # routed copies, router softmax
    return norms + linear_inputs + attn + mlp + _lora_per_token(s, adapters)


def activations(s: Scenario, adapters: list[ParamTensor]) -> Activations:
    m = s.model
    b = s.compute_bytes
    rb = residual_bytes(s)
    n = s.tokens_per_micro_batch
    rows, t = s.micro_batch, s.seq_len
    _, per_key_saved, per_key_transient = _attention_per_token(s, b)
    layer_saved = n * _layer_per_token(s, b, rb, adapters) + rows * t * t * per_key_saved
    masked = s.padding == "padded" and s.micro_batch > 1
    masks = 0
    if s.attention == "eager":
        masks = rows * t * t * b  # 4D float mask (masking_utils eager_mask)
    elif s.attention == "sdpa" and masked:
        masks = rows * t * t  # 4D bool mask
    ckpt_layers, plain_layers = _checkpoint_split(s)
    offloaded = s.checkpointing in ("offload", "unsloth")
    checkpoint = n * rb * m.hidden_size
    v = m.vocab_size
    logits_fwd, logits_saved, logits_bwd = _logits(s, n, v, b)
    h = m.hidden_size
    return Activations(
        layer_saved=layer_saved,
        layer_checkpoint=0 if offloaded else checkpoint,
        checkpointed_layers=ckpt_layers,
        plain_layers=plain_layers,
        outside_layers=n * (4 * h + b * h + b * h),  # final norm (fp32 + bf16) and lm_head input
        shared_masks=masks,
        layer_forward_transient=n * b * max(4 * h, 2 * m.intermediate_size) + rows * t * t * per_key_transient,
        layer_backward_transient=n * b * (3 * m.intermediate_size + 2 * h) + rows * t * t * per_key_transient,
        logits_forward_peak=logits_fwd,
        logits_saved=logits_saved,
        logits_backward_peak=logits_bwd,
        host_offloaded=checkpoint * ckpt_layers if offloaded else 0,
    )


def _checkpoint_split(s: Scenario) -> tuple[int, int]:
    layers = s.model.num_layers
    if s.checkpointing == "off":
        return 0, layers
    if s.checkpointing == "every_n":
        ck = -(-layers // s.checkpoint_every_n)
        return ck, layers - ck
    return layers, 0


def _logits(s: Scenario, n: int, v: int, b: int) -> tuple[int, int, int]:
    """(forward peak, saved after forward, backward peak) of lm_head output + loss."""
    h = s.model.hidden_size
    lb = 4 if (s.precision == "fp32" or s.tuning == "qlora" and s.kbit_upcast) else b
    up = 0 if lb == 4 else 4  # ForCausalLMLoss upcasts logits to fp32 unless they already are
    if s.loss == "liger":
        chunk = min(n, LIGER_CHUNK_ROUND * -(-n // max(1, -(-v // h))))
        grads = n * h * b + (v * h * 4 if s.tuning == "full" else 0)
        return chunk * v * (lb + 4) + grads, grads, grads
    if s.loss == "chunked_nll":
        c = min(n, TRL_CHUNK_TOKENS)
        return c * v * (lb + up + 4), 0, c * v * (lb + up + 8)
    if s.loss == "chunked_output":
        c = -(-n // TORCHTUNE_CHUNKS)
        return n * v * (lb + 4) + c * v * up, n * v * 4, n * v * 4 + c * v * (8 + lb)
    # standard: bf16 logits + fp32 copy + fp32 log_softmax output; backward: saved log_softmax,
    # the dense nll grad and the log_softmax grad alive together
    return n * v * (lb + up + 4), n * v * 4, n * v * 12
