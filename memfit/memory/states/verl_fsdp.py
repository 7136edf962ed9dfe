"""verl's own FSDP engine (FSDPEngineWithLMHead, verl 0.9.1): the bytes per GPU of an actor's update step and of a
forward-only reference's log-prob pass, from the facts of data/verl_fsdp.toml (read from verl's code; measured on 2
gloo ranks by bench/verl_workers.py). What differs from memfit's other FSDP layouts (fsdp.py, accelerate_fsdp.py):

- every model verl's engine builds is fp32 (engine model_dtype fp32, the reference's too), gathered in bf16 and
  reduced in fp32 (MixedPrecision / MixedPrecisionPolicy); the shards, their gradients and AdamW's states are fp32;
- FSDP2 wraps each decoder layer, the embedding and the head as their own units, all resharded after forward (the
  head too, so the log-probs run without it); FSDP1 keeps embedding, final norm and head in the root flat parameter,
  gathered from forward through the loss;
- the log-probs are computed from the head's bf16 logits (remove-padding: one packed row of tokens), by flash-attn's
  in-place cross entropy on a GPU install, by one log_softmax per token row without flash-attn;
- the reference lives on the host (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy): on the GPU only
  the unit running and the logits.

Three functions for callers (the verl placement, bench/verl_workers.py): `actor_update_bytes(s)`,
`actor_log_prob_bytes(s)` and `reference_pass_bytes(s)`; `logprob_path` says which log-prob code runs ("flash_ce" on verl's GPU install,
"torch_rows" without flash-attn).
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.breakdown import Breakdown
from memfit.errors import MemfitError
from memfit.facts.data_table import data_table
from memfit.facts.names import unknown_key
from memfit.memory.activations import activations
from memfit.memory.inventory import ParamTensor, scenario_tensors
from memfit.memory.states.common import torch_optimizer

RELEASE = "0.9.1"  # the verl release whose facts are read; the only one measured
FACT_KEYS = {"torch", "shard_bytes", "gathered_bytes", "reduce_bytes", "fsdp2_head_copies",
             "fsdp1_root_kept", "last_reduce_copies", "reference_on_host", "fsdp1_reference_host_grad",
             "logits_bytes", "saved_per_logit", "backward_per_logit", "loop_temporaries"}
LOGPROB_PATHS = ("flash_ce", "torch_rows")


def facts(release: str = RELEASE) -> dict:
    """The release's row of data/verl_fsdp.toml, every key checked."""
    rows = data_table("verl_fsdp.toml")["release"]
    if release not in rows:
        raise MemfitError(f"verl_fsdp.toml: no facts for verl {release}; measured releases: {', '.join(rows)}")
    row = rows[release]
    for key in row:
        if key not in FACT_KEYS:
            raise unknown_key(f"verl_fsdp.toml [release.{release!r}]", key, FACT_KEYS)
    missing = FACT_KEYS - set(row)
    if missing:
        raise MemfitError(f"verl_fsdp.toml [release.{release!r}]: missing {', '.join(sorted(missing))}")
    return row


@dataclass(frozen=True)
class _Sizes:
    """Element counts of what verl's units hold: every parameter, the embedding, the head, all outside the layers,
    one layer, and the largest tensor AdamW steps (FSDP2: a parameter; FSDP1: a unit's flat parameter)."""
    total: int
    embedding: int
    head: int
    root: int
    layer: int
    largest_stepped: int

    @classmethod
    def of(cls, s, tensors: list[ParamTensor]) -> "_Sizes":
        layers = max(s.model.num_layers, 1)
        outside = [t for t in tensors if not t.per_layer]
        layer = sum(t.total for t in tensors if t.per_layer) // layers
        root = sum(t.total for t in outside)
        trained = [t for t in tensors if t.trainable] or tensors
        # FSDP1 steps each unit's flat parameter; under LoRA each adapter Linear is its own unit (verl's lambda policy)
        whole_units = s.fsdp_version == 1 and all(t.trainable for t in tensors)
        largest = max(root, layer) if whole_units else max(t.numel for t in trained)
        return cls(sum(t.total for t in tensors), sum(t.total for t in outside if t.kind == "embedding"),
                   sum(t.total for t in outside if t.kind == "lm_head"), root, layer, largest)


def _check_path(logprob_path: str) -> None:
    if logprob_path not in LOGPROB_PATHS:
        raise MemfitError(f"logprob_path {logprob_path!r}: valid are {', '.join(LOGPROB_PATHS)}")


def _logit_elements(s) -> int:
    return s.tokens_per_micro_batch * s.model.vocab_size


def _head_input(s, f: dict) -> int:
    """The final hidden states the head reads, alive beside its logits."""
    return s.tokens_per_micro_batch * s.model.hidden_size * f["gathered_bytes"]


def _saved_activations(s, tensors: list[ParamTensor]) -> int:
    """What the layers keep for backward (memfit's activation model: checkpointed inputs, masks, outside layers)."""
    act = activations(s, [t for t in tensors if t.kind == "lora"])
    return (act.layer_checkpoint * act.checkpointed_layers + act.layer_saved * act.plain_layers
            + act.outside_layers + act.shared_masks)


def _head_gathered(s, z: _Sizes, f: dict) -> int:
    """Parameter bytes gathered while the head runs: FSDP2 the head unit (its copies), FSDP1 the whole root."""
    if s.fsdp_version == 1:
        return z.root * f["gathered_bytes"]
    return f["fsdp2_head_copies"] * z.head * f["gathered_bytes"]


def _last_reduced(s, tensors: list[ParamTensor]) -> int:
    """Elements of the last unit backward reduce-scatters: FSDP2 the embedding, FSDP1 the root, where they train;
    else (LoRA) the first layer's trainable parameters (FSDP1 gives each adapter Linear its own unit: one layer's
    adapters err high)."""
    outside = [t for t in tensors if not t.per_layer and t.trainable]
    if s.fsdp_version == 2:
        outside = [t for t in outside if t.kind == "embedding"]
    if outside:
        return sum(t.total for t in outside)
    return sum(t.total for t in tensors if t.per_layer and t.trainable) // max(s.model.num_layers, 1)


def _optimizer_temporaries(s, z: _Sizes, f: dict, n: int) -> int:
    if s.optimizer == "adamw-loop":
        return f["loop_temporaries"] * -(-z.largest_stepped // n) * f["shard_bytes"]
    return -(-z.total // n) * f["shard_bytes"]  # foreach: one list of every state's size


def _larger(*parts: Breakdown) -> Breakdown:
    return max(parts, key=lambda b: b.total)


def _sum(*parts: Breakdown) -> Breakdown:
    out: dict[str, int] = {}
    for b in parts:
        for category, n in b.parts.items():
            out[category] = out.get(category, 0) + n
    return Breakdown(out)


def actor_update_parts(s, logprob_path: str = "flash_ce", release: str = RELEASE) -> dict[str, Breakdown]:
    """What each phase of verl's actor update (forward with the log-probs and loss, backward, optimizer step) holds
    per GPU, by category, full fine-tune or LoRA, without the runtime overhead (context, allocator) the estimate
    adds: fp32 shards and the gathered units are weights, the AdamW states and their step's temporaries optimizer
    states, the layers' saved tensors and the head's input activations, the logits and what the log-probs keep."""
    _check_path(logprob_path)
    f, n = facts(release), s.world_size
    tensors = scenario_tensors(s)
    z = _Sizes.of(s, tensors)
    shards = -(-z.total // n) * f["shard_bytes"]
    grads = -(-sum(t.total for t in tensors if t.trainable) // n) * f["shard_bytes"]
    states = torch_optimizer(s, [t for t in tensors if t.trainable])[0] // n
    saved, logits = _saved_activations(s, tensors), _logit_elements(s)
    kept = Breakdown({"weights": shards, "optimizer_states": states})
    per_logit = f["logits_bytes"] + f["saved_per_logit"][logprob_path]
    head_forward = Breakdown({"weights": _head_gathered(s, z, f), "logits_loss": logits * f["logits_bytes"],
                              "activations": _head_input(s, f)})
    root_kept = z.root * f["gathered_bytes"] if s.fsdp_version == 1 and f["fsdp1_root_kept"] else 0
    after_head = Breakdown({"weights": root_kept, "logits_loss": logits * per_logit})
    # backward starts where forward ended (the log-probs' saved rows); then the head's backward (regathered under
    # FSDP2, the logits' gradient beside it) and the last post-backward, every shard's gradient reduced
    head_backward = Breakdown({"weights": _head_gathered(s, z, f),
                               "logits_loss": logits * f["backward_per_logit"][logprob_path]})
    last_reduce = f["last_reduce_copies"] * _last_reduced(s, tensors) * (f["gathered_bytes"] + f["reduce_bytes"])
    layers = Breakdown({"activations": saved})
    reduced = Breakdown({"gradients": grads, "engine_buffers": last_reduce})
    return {"forward": _sum(kept, layers, _larger(head_forward, after_head)),
            "backward": _sum(kept, _larger(_sum(layers, after_head), _sum(layers, head_backward), reduced)),
            "optimizer_step": _sum(kept, Breakdown({"gradients": grads,
                                                   "optimizer_states": _optimizer_temporaries(s, z, f, n)}))}


def actor_update_bytes(s, logprob_path: str = "flash_ce", release: str = RELEASE) -> dict[str, int]:
    """Allocated bytes per GPU of each phase of verl's actor update (actor_update_parts' totals)."""
    return {phase: b.total for phase, b in actor_update_parts(s, logprob_path, release).items()}


def actor_log_prob_bytes(s, release: str = RELEASE) -> int:
    """Allocated bytes per GPU of the actor's own log-prob pass (compute_log_prob, no_grad, before its update): its
    shards and AdamW states resident (verl's param / optimizer offload moves the shards back for it and leaves the
    states on the host: subtract them there), the head's unit gathered, the head's input and its logits."""
    f, n = facts(release), s.world_size
    tensors = scenario_tensors(s)
    z = _Sizes.of(s, tensors)
    shards = -(-z.total // n) * f["shard_bytes"]
    states = torch_optimizer(s, [t for t in tensors if t.trainable])[0] // n
    return shards + states + _head_gathered(s, z, f) + _logit_elements(s) * f["logits_bytes"] + _head_input(s, f)


def reference_pass_bytes(s, release: str = RELEASE) -> dict[str, int]:
    """Bytes per GPU ("device") and host RAM per rank ("host") of the reference's log-prob pass (no_grad): its shards
    on the host, on the GPU the head's unit gathered, the head's input and its logits (the log-probs' per-row work
    is small beside them)."""
    f, n = facts(release), s.world_size
    tensors = scenario_tensors(s)
    z = _Sizes.of(s, tensors)
    shards = -(-z.total // n) * f["shard_bytes"]
    device = _head_gathered(s, z, f) + _logit_elements(s) * f["logits_bytes"] + _head_input(s, f)
    host = 0
    if f["reference_on_host"]:
        host = shards * (2 if s.fsdp_version == 1 and f["fsdp1_reference_host_grad"] else 1)
    else:
        device += shards
    return {"device": device, "host": host}
