"""HF Trainer's FSDP: what accelerate's own wrapping of a transformers model keeps gathered, by FSDP version (profiles
whose [fsdp] says wrapping = "accelerate"; measured on 2 gloo ranks by bench/accelerate_fsdp.py, torch 2.13,
accelerate 1.15). Bytes per rank on top of the shards fsdp.py counts; L is one decoder layer gathered.

FSDP1 (FullyShardedDataParallel, transformer-layer auto wrap, use_orig_params): the root unit holds all that is outside
the decoder layers (embedding, final norm, head) as one flat parameter that is never resharded after forward (torch
_runtime_utils `_post_forward_reshard`: not for the root), so it stays gathered from the model's forward to its
post-backward, and the head's gradient waits in it from backward's start to its end. In forward one layer runs beside
it (forward_prefetch off, accelerate's default); in backward a layer holds its parameters, the next layer's
(backward_prefetch BACKWARD_PRE, what accelerate configs write; TrainingArguments' own NO_PREFETCH holds one fewer, so
this errs high there) and its gradients twice: each op's and the flat gradient autograd accumulates them into. The
root's post-backward, the root still gathered: its gradients and their flat copy.

FSDP2 (fully_shard as accelerate >= 1.14's fsdp2_prepare_model lays it out): the embedding is its own unit, resharded
after its forward; [final norm, head] one unit kept gathered from its forward until its post-backward right after
the head's backward (reshard_after_forward False); a tied embedding joins that unit, gathered from the embedding's
forward to backward's end. In forward a layer's flat all-gather output outlives its copy-out until the next unit's
(torch `FSDPParamGroup.wait_for_unshard`: implicit prefetch's overlap), so a running layer has its parameters and
two all-gather outputs, and the loss the tail's parameters and its output. A post-backward reshards, then copies the
unsharded gradients into a reduce-scatter input: a layer's backward peaks with its gradients twice beside its
parameters and the next unit's all-gather output.

Reentrant checkpointing from the model's layer loop (transformers 4.x: data/releases.toml `checkpoint_from_loop`;
measured, bench/accelerate_fsdp.py "transformers-4.48" rows, transformers 4.48.1 / accelerate 1.0.1 / peft 0.13.2):
torch's CheckpointFunction recomputes each layer in backward from a detached copy of its input, a leaf, and the
layer's FSDP1 unit runs its forward again on it. A unit whose flat parameter is frozen (PEFT's wrap policy puts LoRA's
A and B in their own units) registers `_register_post_backward_reshard_only_hook` there: a multi-grad hook on its
inputs that need a gradient, whose `grad_fns` keep the leaf's AccumulateGrad, so the leaf (the layer's saved input)
and the gradient accumulated into it live until `_post_backward_final_callback` removes the hook as backward ends
(torch 2.4.1 and 2.13.0 _runtime_utils.py, autograd/graph.py). When the first layer runs its backward every layer
above it still holds both.
"""
from __future__ import annotations

from memfit.facts.releases import release_range
from memfit.facts.versions import pinned
from memfit.facts.scenario import Scenario
from memfit.memory.activations import residual_bytes
from memfit.memory.inventory import ParamTensor
from memfit.memory.states import fsdp_units
from memfit.memory.states.common import ModelStates, quantized_bytes, trainable_dtype_bytes


def _gathered(s: Scenario, t: ParamTensor) -> float:
    """Bytes of a gathered parameter: packed if quantized, the adapters' dtype, else the gathered dtype."""
    return quantized_bytes(s) if t.quantized else s.adapter_bytes if t.kind == "lora" else fsdp_units.gathered_bytes(s)


def _reduce_bytes(s: Scenario, t: ParamTensor) -> int:
    """A reduce-scatter input element: fp32 under a mixed policy, else the gradient's own dtype."""
    return 4 if s.precision.endswith("mixed") else trainable_dtype_bytes(s, t)


def _own_unit(s: Scenario, t: ParamTensor) -> bool:
    """A LoRA Linear under FSDP1: PEFT's fsdp_auto_wrap_policy (transformers' update_fsdp_plugin_peft) makes each
    trainable leaf module its own unit, gathered only while it runs, its flat gradient its one gradient."""
    return s.fsdp_version == 1 and t.kind == "lora" and t.name.endswith((".lora_A", ".lora_B"))


class _Sizes:
    """Bytes of the pieces accelerate wraps apart: one layer, the embedding, the head, the rest outside the layers."""

    def __init__(self, s, tensors: list[ParamTensor]):
        layers = max(s.model.num_layers, 1)
        apart = [t for t in tensors if t.per_layer and _own_unit(s, t)]
        inside = [t for t in tensors if t.per_layer and not _own_unit(s, t)]
        outside = [t for t in tensors if not t.per_layer]
        self.layer = sum(t.total * _gathered(s, t) for t in inside) / layers
        self.layer_grads = sum(t.total * trainable_dtype_bytes(s, t) for t in inside if t.trainable) / layers
        self.layer_reduce = sum(t.total * _reduce_bytes(s, t) for t in inside if t.trainable) / layers
        self.embedding = sum(t.total * _gathered(s, t) for t in outside if t.kind == "embedding")
        self.tail = sum(t.total * _gathered(s, t) for t in outside if t.kind != "embedding")
        self.root = self.embedding + self.tail
        self.head_grads = sum(t.total * trainable_dtype_bytes(s, t) for t in outside if t.trainable and t.kind != "embedding")
        self.head_reduce = sum(t.total * _reduce_bytes(s, t) for t in outside if t.trainable and t.kind != "embedding")
        self.embedding_grads = sum(t.total * trainable_dtype_bytes(s, t) for t in outside
                                   if t.trainable and t.kind == "embedding")
        self.embedding_reduce = sum(t.total * _reduce_bytes(s, t) for t in outside if t.trainable and t.kind == "embedding")
        self.layers = layers
        self.apart_grads = sum(t.total * trainable_dtype_bytes(s, t) for t in apart) / layers


def _fsdp1(s: Scenario, z: _Sizes, ms: ModelStates, n: int) -> None:
    root, layer = int(z.root), int(z.layer)
    ms.gathered_forward = root + layer  # forward_prefetch off (accelerate's and TrainingArguments' default)
    ms.gathered_loss = ms.gathered_head = ms.gathered_backward_start = root
    ms.gathered_backward = root + 2 * layer
    ms.head_grads = int(z.head_grads)
    ms.grads_unreduced = int(2 * z.layer_grads + z.apart_grads + z.head_grads)
    # the next-to-last layer's moment: the layers above it reduced, it and the one prefetched not yet
    ms.grads_at_end = -(-int(max(z.layers - 2, 0) * (z.layer_grads + z.apart_grads)) // n)
    # the root's post-backward: each gradient and their flat copy (its sharded output, counted among the gradients
    # after backward, comes after)
    root_grads = z.head_grads + z.embedding_grads
    ms.last_reduce = int(2 * root_grads - root_grads // n)
    ms.gathered_end = root if root_grads else 0


def _fsdp2(s: Scenario, z: _Sizes, ms: ModelStates, n: int) -> None:
    layer = int(z.layer)
    tied = s.model.tie_embeddings
    kept = int(z.root) if tied else 0  # the tail unit with the tied embedding: gathered from forward's start
    tail = int(z.root if tied else z.tail)
    # a tied tail's all-gather output waits for the first layer's copy-out: both with that layer's output
    ms.gathered_forward = kept + layer + max(kept, 2 * layer)
    ms.gathered_loss = ms.gathered_head = ms.gathered_backward_start = tail
    ms.forward_flat = 0 if tied else tail  # the tail's all-gather output, freed when forward ends
    # the layer's parameters and the next unit's all-gather output (the embedding's, after the first layer)
    embedding_next = int(z.embedding) if z.embedding_grads and not tied else 0
    ms.gathered_backward = kept + layer + max(layer, embedding_next)
    ms.grads_unreduced = int(z.layer_grads + z.layer_reduce)
    ms.grads_at_end = -(-int(max(z.layers - 2, 0) * z.layer_grads + z.head_grads) // n)
    ms.head_grads = int(z.head_grads + z.head_reduce)  # the head's gradient and its reduce-scatter input
    if not tied:
        # the embedding's pre-backward gathers it at backward's end (its output requires grad when it trains, and
        # under checkpointing's input-grad hook when it does not): its all-gather output and copy-out; a trained one
        # then reshards and holds its gradient and reduce-scatter input, at least as many bytes
        ms.last_reduce = int(z.embedding_grads + z.embedding_reduce)
        ms.gathered_end = 0 if ms.last_reduce else 2 * int(z.embedding)


def _tied(s: Scenario, z: _Sizes, ms: ModelStates, n: int) -> None:
    """A trained embedding tied to the head, still gathered as its backward ends: the head's gradient and the
    embedding's are summed out of place (plain.py's three V x H gradients), every layer's shard already reduced, the
    unit holding the tied weight gathered (FSDP2: beside the first layer's all-gather output)."""
    ms.tied_embedding_grads = int(z.embedding_grads)
    ms.grads_before_tied = ms.grads_after_backward - -(-int(z.embedding_grads) // n)
    ms.gathered_end = int(z.root) + (int(z.layer) if s.fsdp_version == 2 else 0)


def _checkpointed_from_loop(s: Scenario) -> bool:
    """The run's transformers checkpoints this family's layers from the model's loop (data/releases.toml)."""
    version = dict(s.releases).get("transformers") or pinned()["transformers"]
    return s.model.arch in release_range("transformers", version).get("checkpoint_from_loop", ())


def _reentrant_inputs_held(s: Scenario, tensors: list[ParamTensor]) -> int:
    """The inputs of the layers above the first, and their gradients, held by FSDP1's reshard-only hooks when the
    first layer runs its backward (the module docstring): the layers' units frozen, each recomputed by reentrant
    checkpointing from the model's loop."""
    if not (s.reentrant and s.checkpointing in ("full", "every_n") and _checkpointed_from_loop(s)):
        return 0
    if any(t.per_layer and t.trainable and not _own_unit(s, t) for t in tensors):  # the layer's unit trains
        return 0
    layers = s.model.num_layers if s.checkpointing == "full" else -(-s.model.num_layers // s.checkpoint_every_n)
    layer_input = s.tokens_per_micro_batch * s.model.hidden_size * residual_bytes(s)
    return 2 * max(layers - 1, 0) * layer_input


def apply(s: Scenario, tensors: list[ParamTensor], ms: ModelStates, n: int) -> None:
    if s.world_size < 2 or s.fsdp_strategy != "full_shard":
        return
    z = _Sizes(s, tensors)
    (_fsdp1 if s.fsdp_version == 1 else _fsdp2)(s, z, ms, n)
    if s.fsdp_version == 1:
        ms.layer_inputs_held = _reentrant_inputs_held(s, tensors)
    if s.model.tie_embeddings and z.embedding_grads:
        _tied(s, z, ms, n)
