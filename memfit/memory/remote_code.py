"""A hub remote-code family's own modeling code, where it holds what the transformers-shaped count does not
(data/remote_code.toml, traced on the family's own file: memfit/trace/qwen1_facts.py for Qwen-1,
memfit/trace/glm4_facts.py for GLM-4, whose differences are in memory/remote_chatglm.py).

memory/activations.py counts what transformers' modeling code saves; `adjusted` moves that count to the family's
own code. Applied on the setups the facts were traced on (the transformers-run profiles, a bf16 module with or
without autocast as traced per family; SDPA and the file's eager path) and nowhere else: flash branches were not
traced.
"""
from __future__ import annotations

from dataclasses import replace

from memfit.facts.frameworks import model_code
from memfit.facts.remote_code import derived
from memfit.facts.scenario import Scenario
from memfit.memory import remote_chatglm


def _setup(s: Scenario) -> dict:
    """The facts of the setup the run is in ({} when the family's code was not traced, or not in this setup): a
    16-bit module under autocast (HF Trainer's bf16=True) or without it (DeepSpeed / FSDP)."""
    d = derived(s.model.arch)
    if not d or model_code(s.profile) or s.compute_bytes != 2:
        return {}
    # accelerate runs FSDP's forward under autocast too (docs/knobs.md H.5), which memfit's FSDP engine leaves out:
    # here that would lower the estimate (the file's 16-bit loss), so FSDP takes the autocast facts
    autocast = s.runs_autocast or s.engine == "fsdp"
    return d.get("autocast" if autocast else "plain", {})


def adjusted(s: Scenario, act, per_key: tuple[int, int, int] = (0, 0, 0)):
    """`act` (memory/activations.py's Activations) with the family's own code's differences; `per_key`: the count's
    attention bytes per (token x key) of a row: saved, forward transient, backward transient."""
    d = _setup(s)
    if not d:
        return act
    if s.model.arch == "chatglm":
        return replace(act, **remote_chatglm.changes(s, act, d))
    m, b = s.model, s.compute_bytes
    n, rows, t = s.tokens_per_micro_batch, s.micro_batch, s.seq_len
    changes: dict = {}
    if s.attention == "sdpa":
        # the fused qkv output outlives forward through the kernel's saved v (a view of it): its q and k parts are
        # beyond the separate v the transformers-shaped count has
        layer = n * b * d["fused_qkv_kept"] * (m.num_heads + m.num_kv_heads) * m.head_dim
        if s.padding == "padded":  # each layer builds and saves its own rows x 1 x T x T mask (counted at b a row)
            layer += rows * t * t * (d["mask_padded"] - b)
        else:  # no attention_mask: each layer's bool tril(T x T), saved as an additive mask (the count has none)
            keys = n if s.padding == "padding_free" else t
            layer += int(keys * keys * d["mask_causal"])
        # the file's shared mask is rows x 1 x 1 x T; the count's shared bool T x T mask is not built
        changes["shared_masks"] = int(rows * t * t * d["shared_mask"])
        changes["layer_saved"] = act.layer_saved + int(layer)
    elif s.attention == "eager":  # the file's `_attn`: its own per-head score bytes in place of the count's; PV
        # keeps v, a view of the fused output; each layer keeps its own bool tril(T x T) (torch.where's condition)
        # and no float T x T mask is shared (the count's 4D mask)
        keys = n if s.padding == "padding_free" else t
        saved, forward, backward = per_key
        heads = m.num_heads
        layer = n * b * d["fused_qkv_kept"] * (m.num_heads + m.num_kv_heads) * m.head_dim
        layer += rows * t * t * (heads * d["eager_scores"] - saved) + keys * keys * d["eager_mask"]
        changes["layer_saved"] = act.layer_saved + int(layer)
        changes["shared_masks"] = int(rows * t * t * d["eager_shared_mask"])
        changes["layer_forward_transient"] = act.layer_forward_transient + int(rows * t * t * (
            heads * d["eager_forward"] - forward))
        changes["layer_backward_transient"] = act.layer_backward_transient + int(rows * t * t * (
            heads * d["eager_backward"] - backward))
    # RotaryEmbedding's fp32 cos/sin cache of max(2 T, 16) positions, kept by the module
    changes["outside_layers"] = act.outside_layers + int(d["rotary_cache"] * max(2 * t, 16) * m.head_dim)
    if s.loss == "standard" and s.method == "sft" and not s.trainable_tokens \
            and not (s.tuning == "qlora" and s.kbit_upcast):
        # its own loss (not transformers'): what any transformers release the run names does not change it
        per = d["logits"] if s.micro_batch > 1 else d["logits_one_row"]
        fwd, saved, bwd = (int(n * m.vocab_size * x) for x in per)
        changes |= {"logits_forward_peak": fwd, "logits_saved": saved, "logits_backward_peak": bwd}
    return replace(act, **changes)


def notes(s: Scenario) -> list[str]:
    """What the estimate took from the family's own code, for the run's "assumed" list."""
    from memfit.facts.remote_code import remote_code

    table = remote_code(s.model.arch)
    if not _setup(s):
        return []
    src = table["source"]
    if s.model.arch == "chatglm":
        return [remote_chatglm.note(s, src)]
    said = (f"{s.model.arch}: activations and loss as traced on its own {src['path']} ({src['repo']}@"
            f"{src['commit'][:10]}, file of {src['file_date']}; data/remote_code.toml)")
    if s.attention == "sdpa":
        return [said + ": a mask saved by every layer, the fused c_attn output kept, its own shifted loss"]
    if s.attention == "eager":
        return [said + ": attention 'eager' is the file's `_attn` path (its own on torch < 2, and on any torch in hub "
                "revisions before 2023-10-14): the softmax output (fp32 under autocast) and its bf16 copy kept per head, "
                "a bool causal mask per layer"]
    return [f"{said} on SDPA and `_attn` only: its {s.attention} path was not traced (the file takes its flash-attn "
            "branch when flash-attn is installed), the transformers-shaped count is used"]
