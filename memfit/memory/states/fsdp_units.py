"""What a framework's own FSDP wrapping changes in the FSDP byte model (fsdp.py), read from its profile's
[model_code.several_devices] (LitGPT's finetune scripts; measured: bench/litgpt_distributed.py, 2 gloo ranks):

- `root_gathered`: the root unit (embedding, final norm, head) is left gathered from its forward to its post-backward.
  FSDP1 never frees the root's unsharded flat parameter after forward (torch.distributed.fsdp._runtime_utils
  `_post_forward_reshard`: `not state._is_root`); FSDP2's fully_shard keeps the root unsharded when
  reshard_after_forward is left unset (torch 2.13 _fsdp_state.py `_auto_reshard_after_forward`).
- `flat_params`: tunings run by FSDP1 with use_orig_params=True (Lightning Fabric's FSDPStrategy default). Each unit is
  one FlatParameter that requires grad when any of its parameters does; the original parameters are views of it, so
  autograd computes a gradient for every parameter of such a unit, frozen ones included, and the unit's whole flat
  gradient is reduce-scattered and kept sharded until the next forward (`_reset_flat_param_grad_info_if_needed`).
  A unit with no trainable parameter (LLaMA-Adapter v1's layers below its prompt) gets none.
- `mixed` (bf16-mixed): the model is built in fp32, so every shard is fp32; FSDP1's MixedPrecision gathers bf16 copies
  (its unsharded gradients bf16, the sharded ones fp32), lora.py's FSDP2 has no MixedPrecisionPolicy and gathers the
  fp32 params, which Fabric's autocast forward casts as plain torch's does (fsdp.py: the weight casts).
"""
from __future__ import annotations

from memfit.facts.frameworks import model_code, several_devices_dtypes
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import ParamTensor
from memfit.memory.states.common import ModelStates


def gathered_bytes(s: Scenario) -> int:
    """Bytes of a gathered parameter (and of the unsharded gradient its backward makes): the framework's own strategy
    under mixed precision ([model_code.several_devices.mixed]: LitGPT's FSDP1 MixedPrecision param_dtype bf16, its
    FSDP2 with no MixedPrecisionPolicy fp32), else the compute dtype (a MixedPrecisionPolicy's param_dtype)."""
    dtypes = several_devices_dtypes(s)
    return dtypes[1] if dtypes else s.compute_bytes


def shard_bytes(s: Scenario) -> int | None:
    """Bytes of a shard of a frozen parameter where the framework builds the model in its own dtype under mixed
    precision (LitGPT: fp32, so the shards are fp32); None: the engine's own rule (common.frozen_bytes)."""
    dtypes = several_devices_dtypes(s)
    return dtypes[0] if dtypes else None


def _per_layer_bytes(s: Scenario, tensors: list[ParamTensor]) -> int:
    return int(sum(t.total for t in tensors if t.per_layer) * gathered_bytes(s) / max(s.model.num_layers, 1))


def _per_layer_elements(s: Scenario, tensors: list[ParamTensor]) -> int:
    return int(sum(t.total for t in tensors if t.per_layer) / max(s.model.num_layers, 1))


def _root_elements(tensors: list[ParamTensor]) -> int:
    return sum(t.total for t in tensors if not t.per_layer)


def _keep_root_gathered(s: Scenario, tensors: list[ParamTensor], ms: ModelStates) -> None:
    """The root gathered all through forward and backward, beside the running unit and the one prefetched (FSDP2's
    prefetch, FSDP1's limit_all_gathers: two in flight). While the loss runs and as its backward starts no layer is
    gathered (the last one's pre-backward gathers it after the head's backward)."""
    root = _root_elements(tensors) * gathered_bytes(s)
    ms.gathered_forward = ms.gathered_backward = root + 2 * _per_layer_bytes(s, tensors)
    ms.gathered_loss = ms.gathered_head = ms.gathered_backward_start = root
    ms.regather = 0


def _flat_unit_grads(s: Scenario, tensors: list[ParamTensor], ms: ModelStates, n: int) -> None:
    trained_layers = max((t.count for t in tensors if t.per_layer and t.trainable), default=0)
    trained_layers = min(trained_layers, s.model.num_layers)
    root_trains = any(t.trainable for t in tensors if not t.per_layer)
    layer = _per_layer_elements(s, tensors)
    root = _root_elements(tensors)
    unsharded = gathered_bytes(s)
    graded = layer * trained_layers + (root if root_trains else 0)
    # the sharded flat gradient takes the flat parameter's dtype (FSDP1 casts the reduced gradient back to it); the
    # unsharded one, made by the unit's backward, the gathered parameter's (MixedPrecision's param_dtype)
    sharded_bytes = 2 if s.precision.endswith("pure") else 4
    ms.grads_after_backward = -(-graded * sharded_bytes // n)
    ms.grads_between_steps = ms.grads_after_backward if s.grad_accum > 1 else 0
    head = next((t.total for t in tensors if t.kind == "lm_head"), 0) if root_trains and not s.model.tie_embeddings else 0
    # a unit's unsharded flat gradient while it waits for its reduce-scatter; the head's weight gradient, made at
    # backward's start, lives in the root's flat gradient until the root's post-backward at backward's end
    ms.grads_unreduced = (layer if trained_layers else 0) * unsharded + head * unsharded
    ms.head_grads = head * unsharded
    # backward's largest layer moment is its next-to-last trained layer: the root and two layers gathered (it and the
    # one prefetched), the layers above it reduced; at the last one nothing is prefetched and one more is reduced,
    # fewer bytes while a gathered layer (2 B x L) outweighs one sharded gradient (2 or 4 B x L / N)
    ms.grads_at_end = 0 if s.fsdp_cpu_offload else -(-max(trained_layers - 2, 0) * layer * sharded_bytes // n)
    # the root's post-backward: its whole unsharded flat gradient and the sharded output of its reduce-scatter
    ms.last_reduce = (root * unsharded + -(-root * sharded_bytes // n)) if root_trains else 0


def apply(s: Scenario, tensors: list[ParamTensor], ms: ModelStates, n: int) -> None:
    several = model_code(s.profile).get("several_devices", {})
    if s.world_size < 2 or s.fsdp_strategy != "full_shard":
        return
    if several.get("root_gathered"):
        _keep_root_gathered(s, tensors, ms)
    if s.tuning in several.get("flat_params", ()):
        _flat_unit_grads(s, tensors, ms, n)
