"""What eager attention (and torch's math SDPA kernel) holds per token x key, and the backward moment of one
decoder layer that those terms drive.

Saved and forward terms: read from transformers' eager_attention_forward and the families' own eager paths
(docs/knobs.md C), checked on fake-tensor traces. The backward moment, traced (transformers 5.24; Llama-3.2-1B,
Mistral-7B, SantaCoder, Gemma-2, Falcon-7B sizes; checkpointed and not): inside one layer the MLP's backward
finishes before the attention's starts, and releases what it read as it goes (the MLP's and the post-attention
norm's saved inputs, o_proj's input, the residual dropout masks). The attention's backward then peaks at the
softmax's backward, with the saved probabilities, the gradient arriving at them in the softmax's dtype (the fp32
copy the `.to()` cast's backward makes) and the softmax's own gradient alive at once; the PV input copy, the
dropout output and its mask are already released by then. Beside them: what the attention side saved (its input
norm, the q/k/v inputs, q and the repeated k; the repeated v's place taken by its gradient) and the residual
stream's gradient. So the layer's backward moment is the larger of the MLP's (every saved tensor plus the MLP's
gradient temporaries) and the attention's, not their sum.
"""
from __future__ import annotations

from memfit.facts.scenario import Scenario


def eager_probs_bytes(s: Scenario, b: int) -> int:
    """Bytes per element of the eager softmax output: fp32 when the code asks for it (dtype=torch.float32) or
    leaves it to autocast (CUDA autocast runs softmax in fp32), else the scores' dtype (no dtype= without autocast,
    or dtype= the attention input's dtype as Falcon does)."""
    return 4 if s.runs_autocast or not s.model.eager_softmax_in_input_dtype else b


def eager_kernel(s: Scenario, b: int) -> tuple[int, int, int]:
    """Eager attention's (saved bytes per token, saved bytes per token x key, forward transient per token x key):
    q and repeated k for QK^T, the softmax output and (fp32 softmax, or a dropout between) the tensor PV reads,
    repeated v (the contiguous copy of the output is o_proj's input, counted with the Linear inputs); attention
    dropout keeps a bool mask per score."""
    m = s.model
    q = m.num_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    repeated = q if m.num_kv_heads != m.num_heads and m.eager_repeats_kv else kv
    dropout = m.attn_dropout > 0
    # a softmax left to autocast (no dtype=) runs in fp32 on CUDA under autocast, else in the scores' dtype; then
    # its output is PV's input too, and only a dropout in between makes PV read a second tensor
    fp32_softmax = s.runs_autocast or not m.eager_softmax_in_input_dtype
    probs = eager_probs_bytes(s, b)
    pv_input = b if fp32_softmax or dropout else 0
    per_key_saved = m.num_heads * (probs + pv_input + (b if m.attn_softcap else 0) + (1 if dropout else 0))
    # 16-bit scores into an fp32 softmax: the masked scores and their fp32 copy (autocast and softmax(dtype=) convert
    # first; CUDA fuses fp16 -> fp32 only), beside the softmax output when the layer does not save it (traced); the
    # raw QK^T product too where the code keeps it referenced (Falcon divides it in place, then adds the mask)
    copy = 0 if s.precision.startswith("fp16") and not s.runs_autocast else 4
    ckpt = s.checkpointing != "off"
    converted = (b + copy + (4 if ckpt else 0) + (b if m.eager_scores_kept else 0)
                 if probs == 4 and b < 4 else None)
    # a layer that returns its probabilities to a loop keeping them (Falcon's `outputs = block(...)`) holds them
    # through the next layer's forward, where no-grad (checkpointed) layers save nothing else (traced)
    returned = probs if m.eager_returns_probs and ckpt else 0
    per_key_transient = m.num_heads * ((m.eager_score_bytes or converted or b + b + probs) + returned)
    qk = 4 if m.eager_qk_fp32 and not s.runs_autocast else b  # fp32 q, k copies saved by QK^T (GPT-J, no autocast)
    return qk * (q + repeated) + b * repeated, per_key_saved, per_key_transient


def attention_backward_per_key(s: Scenario, b: int, per_key_saved: int) -> int:
    """Per token x key bytes the attention's backward holds beyond the scores the layer saved (per_key_saved), at
    its peak: the largest of PV's input gradient arriving (everything saved alive), its fp32 copy, dropout's
    backward (its mask, incoming and outgoing gradient), and the softmax's backward (the saved probabilities,
    their gradient and the scores' gradient; a soft-cap's saved tanh output waits for its own backward)."""
    m = s.model
    if s.attention == "sdpa" and m.sdpa_math:  # torch's math kernel: the fp32 gradients of probabilities and scores
        return 8 * m.num_heads
    if s.attention != "eager":
        return 0
    p = eager_probs_bytes(s, b)
    saved = per_key_saved // m.num_heads
    capped = b if m.attn_softcap else 0
    # CUDA converts fp16 -> fp32 inside the softmax (no copy, eager_kernel): its backward returns fp16
    fused = s.precision.startswith("fp16") and not s.runs_autocast
    moments = [saved + b,
               p + capped + b + 4 if p == 4 and b < 4 else 0,
               p + capped + 1 + 2 * b if m.attn_dropout > 0 else 0,
               2 * p + capped + (b if fused else p)]
    return m.num_heads * max(0, max(moments) - saved)


def layer_backward_transient(s: Scenario, n: int, b: int, rb: int, mlp_transient: int, mlp_side: int, keys: int,
                             per_key_saved: int) -> int:
    """Bytes one layer holds beyond its saved set at its backward peak: the larger of its MLP's backward
    (`mlp_transient` on top of everything saved) and its attention's (the MLP side's `mlp_side` bytes per token
    released, the residual gradient and the score gradients held; `keys`: rows x T x T)."""
    per_key = attention_backward_per_key(s, b, per_key_saved)
    if not per_key:  # fused kernels: nothing per key; the MLP's moment as before
        return mlp_transient
    attention = n * (rb * s.model.hidden_size - mlp_side) + keys * per_key
    return max(mlp_transient, attention)
