"""GLM-4's own modeling_chatglm.py (hub remote code, arch "chatglm"), where it keeps what the transformers-shaped
count of memory/activations.py does not (data/remote_code.toml [chatglm], traced by memfit/trace/glm4_facts.py).

Traced: a bf16 module without autocast (DeepSpeed, OpenRLHF), full fine-tuning, eager (CoreAttention) and SDPA
(SdpaAttention). What differs from the count, per the trace:
- its RMSNorm multiplies the 16-bit input by the fp32 rsqrt and the weight by the fp32 product: each norm keeps
  its input and an fp32 normalized tensor beside the fp32 copy (the count's transformers RMSNorm keeps the copy
  and a 16-bit normalized tensor);
- a padded batch's mask is the file's get_masks: one bool rows x 1 x T x T shared by the layers; without padding
  each eager layer builds its own bool causal mask, and SDPA runs causal on K and V repeated to every head.
"""
from __future__ import annotations

from memfit.facts.scenario import Scenario


def changes(s: Scenario, act, d: dict) -> dict:
    """The Activations fields the file changes, from its traced facts `d` (one setup's table)."""
    if s.tuning != "full":  # traced with trainable norms only; a frozen norm weight saves less
        return {}
    m, b = s.model, s.compute_bytes
    n, rows, t, h = s.tokens_per_micro_batch, s.micro_batch, s.seq_len, s.model.hidden_size
    count_norm = 4 + (4 if m.norm_fp32_scale else b)  # the count's RMSNorm with a trainable weight, per hidden unit
    norm = n * h * (d["norm_fp32"] + d["norm_input"] - count_norm)
    layer = m.norms_per_layer * norm
    out = {"outside_layers": act.outside_layers + norm}  # the final norm
    padded = s.padding == "padded"
    if padded and s.attention in ("eager", "sdpa"):
        out["shared_masks"] = int(rows * t * t * d["mask_padded"])
    elif s.attention == "eager":  # no mask passed: each layer's own causal mask, none shared
        per_row = n * n if s.padding == "padding_free" else rows * t * t
        layer += int(per_row * d["eager_mask_causal"])
        out["shared_masks"] = 0
    elif s.attention == "sdpa" and d["kv_repeated"] and m.num_kv_heads != m.num_heads:
        # causal SDPA takes the flash kernel, on the K and V the file expanded to every head (the count: kv heads)
        layer += n * b * 2 * (m.num_heads - m.num_kv_heads) * m.head_dim
    out["layer_saved"] = act.layer_saved + int(layer)
    return out


def note(s: Scenario, src: dict) -> str:
    """What the estimate took from the file, for the run's "assumed" list."""
    said = (f"chatglm: activations as traced on its own {src['path']} ({src['repo']}@{src['commit'][:10]}, file of "
            f"{src['file_date']}; data/remote_code.toml)")
    if s.tuning != "full":
        return f"{said}, with full fine-tuning only: for {s.tuning} the transformers-shaped count is used"
    if s.attention not in ("eager", "sdpa"):
        return (f"{said}, on eager CoreAttention and SdpaAttention only: its {s.attention} path was not traced, the "
                "transformers-shaped count is used")
    return (f"{said}: RMSNorm keeps its 16-bit input and an fp32 normalized tensor; one bool mask from get_masks "
            "shared by the layers" + ("; eager: the fp32 softmax output and its 16-bit copy per head"
                                      if s.attention == "eager" else ""))
