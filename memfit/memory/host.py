"""Host RAM per node by phase: loading copies, offloaded states, pinned buffers, checkpoint save and resume.

Sources: docs/knobs.md G (model loading), A.6 (offload buffers), A.8 (checkpoint
load / resume), C.2 (offloaded checkpointing).
"""
from __future__ import annotations

from memfit.facts.engines import engine_of
from memfit.memory import overheads
from memfit.memory.activations import Activations
from memfit.breakdown import Breakdown, PhaseProfile
from memfit.memory.inventory import ParamTensor
from memfit.facts.scenario import Scenario
from memfit.memory.states import ModelStates


def _load_copies(s: Scenario, model_bytes: int) -> int:
    """Host bytes per node while weights load, before they move to the GPUs."""
    g = s.hardware.gpus_per_node
    if engine_of(s).loads_once_per_node(s):
        return model_bytes  # rank 0 reads the checkpoint; the others build on meta
    per_rank = model_bytes if s.profile != "llamafactory" else 0  # device_map={"": rank} loads to GPU
    if not s.low_cpu_mem_usage:
        per_rank = 2 * model_bytes  # random init on CPU, then the state dict beside it
    return g * per_rank


def _offloaded(ms: ModelStates, g: int) -> dict[str, int]:
    """Offloaded buffers by category; the pinned allocator's power-of-two rounding is runtime overhead."""
    parts = {"optimizer_states": 0, "gradients": 0, "weights": 0, "engine_buffers": 0, "runtime_overhead": 0}
    for buf in ms.host:
        parts[buf.category] += buf.nbytes * g
        parts["runtime_overhead"] += (buf.resident - buf.nbytes) * g
    return parts


def host_profile(s: Scenario, tensors: list[ParamTensor], ms: ModelStates, act: Activations) -> PhaseProfile:
    g = s.hardware.gpus_per_node
    base = {"runtime_overhead": overheads.host_baseline(s.hardware.runtime) * g}
    model_bytes = sum(t.total for t in tensors if t.kind != "lora") * s.compute_bytes
    # PEFT adds the adapters on each rank's host copy, in their own dtype, before the engine moves or casts them
    adapters = sum(t.total for t in tensors if t.kind == "lora") * (4 if s.adapter_dtype == "fp32" else s.compute_bytes)
    psi = sum(t.total for t in tensors if t.trainable)
    offloaded = _offloaded(ms, g)
    steady = {**base, **offloaded, "runtime_overhead": base["runtime_overhead"] + offloaded["runtime_overhead"]}
    steady["activations"] = act.host_offloaded * g
    # weights load before the engine exists: offload buffers are allocated later, by deepspeed.initialize
    load = dict(base, weights=_load_copies(s, model_bytes) + g * adapters)
    # a DeepSpeed checkpoint writes each rank's own partitions; torch.save streams their storages
    save = dict(steady)
    resume = dict(steady)
    # each rank torch.loads its checkpoint files at once, without mmap (docs/knobs.md A.8, FINDINGS.md)
    resume["optimizer_states"] += g * (ms.resume_host if engine_of(s).sharded_checkpoint(s) else 12 * psi)
    return PhaseProfile({
        "load": Breakdown(load),
        "forward": Breakdown(steady),
        "backward": Breakdown(steady),
        "optimizer_step": Breakdown(steady),
        "checkpoint_save": Breakdown(save),
        "resume": Breakdown(resume),
    })
