"""One GPU or DDP: every rank holds all weights, gradients and optimizer states (docs/knobs.md F.4, H.4)."""
from __future__ import annotations

from memfit.memory.inventory import ParamTensor
from memfit.memory.own_code import head_casts, prompt_layers
from memfit.memory.states.common import ModelStates, frozen_bytes, torch_optimizer, trainable_dtype_bytes
from memfit.facts.scenario import Scenario

# DDP allocates flat gradient buckets (gradient_as_bucket_view=False by default): a second copy of
# every gradient (torch/nn/parallel/distributed.py Reducer). Accelerate/HF keep that default.
DDP_BUCKET_COPY = True


def _reads_as_head(s: Scenario, t: ParamTensor) -> bool:
    return t.kind == "lm_head" or t.kind == "embedding" and s.model.tie_embeddings


def _fp32_under_autocast(s: Scenario, t: ParamTensor) -> bool:
    if (s.frozen_fp32_in_module or s.tuning == "qlora" and s.kbit_upcast) and not t.trainable and _reads_as_head(s, t):
        return True  # an fp32 head (PEFT's kbit upcast too); a tied one multiplies by the embedding's fp32 weight
    if t.kind not in ("linear", "lm_head", "lora") and not _reads_as_head(s, t) or t.quantized:
        return False  # a tied embedding's weight is the head's matmul operand: cast like a Linear's (traced)
    if t.kind == "lora" and s.tuning not in ("lora", "qlora", "ptuning"):
        return False  # other PEFT methods: the casts they save are in their layer facts (data/peft.toml)
    if t.trainable:
        return trainable_dtype_bytes(s, t) == 4
    return s.frozen_fp32_in_module and t.kind != "lora"  # _frozen_casts


def _cast_bytes(s: Scenario, t: ParamTensor) -> int:
    """A trainable weight's cast is cached once per forward; a frozen head is cast at every call (head_casts)."""
    return t.total * s.compute_bytes * (1 if t.trainable else head_casts(s))


def _frozen_casts(s: Scenario, copies: list[ParamTensor]) -> int:
    """Autocast caches no cast of a frozen fp32 weight (requires_grad off), but each matmul saves the 16-bit copy it
    read for its input's gradient until that Linear's backward: held by the layers that are not checkpointed (a
    checkpointed layer drops them with the rest of what it saved)."""
    layer_copies = sum(t.total * s.compute_bytes for t in copies if not t.trainable and t.per_layer)
    layers = max(s.model.num_layers, 1)
    graded = prompt_layers(s) or layers  # LLaMA-Adapter: no gradient below the first prompt, so no copy kept there
    checkpointed = {"off": 0, "every_n": -(-graded // max(s.checkpoint_every_n, 1))}.get(s.checkpointing, graded)
    return layer_copies * (graded - checkpointed) // layers


def autocast_casts(s: Scenario, tensors: list[ParamTensor], ms: ModelStates) -> None:
    """autocast casts each fp32 weight a matmul reads to 16 bit; the copies are cached through forward and saved for
    backward by the matmuls whose input needs a gradient (aten autocast_mode.cpp). Also a framework's FSDP that
    gathers fp32 params under autocast (fsdp.py), whose module holds the gathered fp32 weights as plain torch's does."""
    copies = [t for t in tensors if _fp32_under_autocast(s, t)]
    cached = [t for t in copies if t.trainable or _reads_as_head(s, t)]
    ms.autocast_cache = sum(_cast_bytes(s, t) for t in cached) + _frozen_casts(s, copies)
    ms.autocast_cache_head = sum(_cast_bytes(s, t) for t in cached if _reads_as_head(s, t))


def recompute_casts(s: Scenario, tensors: list[ParamTensor]) -> int:
    """One layer's frozen-weight casts: a checkpointed layer's recompute (which runs under the autocast state its
    forward saved) casts them again and its matmuls save them until the layer's backward is done."""
    copies = [t for t in tensors if _fp32_under_autocast(s, t) and not t.trainable and t.per_layer]
    return sum(t.total * s.compute_bytes for t in copies) // max(s.model.num_layers, 1)


def states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    trainable = [t for t in tensors if t.trainable]
    grads = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable)
    optimizer, temps, paged = torch_optimizer(s, trainable)
    ms = ModelStates(
        weights=int(frozen_bytes(s, tensors)) + grads,  # trainable weights have the grads' dtype
        grads_between_steps=grads if s.grad_accum > 1 else 0,
        grads_after_backward=grads,
        optimizer=optimizer,
        step_temporaries=temps,
        paged_optimizer=paged,
    )
    if s.runs_autocast:
        autocast_casts(s, tensors, ms)
    # the whole layer's (its q, k, v gradients come after the attention's peak: errs high by those)
    per_layer = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable if t.per_layer)
    ms.top_layer_grads = per_layer // max(s.model.num_layers, 1)
    if s.model.tie_embeddings:
        ms.tied_embedding_grads = sum(t.total * trainable_dtype_bytes(s, t) for t in trainable if t.kind == "embedding")
    if s.steps_in_backward:
        # the step runs inside backward per parameter, so only one gradient exists at a time, and the hook frees
        # it after stepping (torchtune register_optim_in_bwd_hooks: zero_grad, set_to_none): none between steps
        largest = max((t.numel * trainable_dtype_bytes(s, t) for t in trainable), default=0)
        ms.grads_after_backward = largest
        ms.grads_between_steps = 0
        ms.step_temporaries = min(ms.step_temporaries, largest)
    if s.world_size > 1 and DDP_BUCKET_COPY:
        ms.engine_buffers = grads
        ms.notes.append("DDP keeps flat gradient buckets beside param.grad (gradient_as_bucket_view=False)")
    return ms


def frozen_copy(s: Scenario, tensors: list[ParamTensor], offload: bool) -> tuple[str, int, int, int, list[str]]:
    """A frozen model (reference, reward) beside this engine: a full 16-bit replica on every GPU.
    Returns (placement in words, resident bytes, gathered bytes, host bytes per rank, notes)."""
    notes = ["reference/reward offload sets offload_param, which only ZeRO-3 honours: ignored here"] if offload else []
    return (f"full 16-bit replica on every GPU ({s.engine})", sum(t.total for t in tensors) * s.compute_bytes, 0, 0,
            notes)
