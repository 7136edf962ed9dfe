"""Live tensor bytes by category, side and phase, from every storage the real code allocates.

A `TorchDispatchMode` sees each op's outputs; a storage seen for the first time is registered with its
size and a label (category, side) and a finalizer removes it when the storage dies. Peaks are kept per
(step, phase, side) together with the category vector at that moment, so a phase's peak is a sum of
named parts.

Labels come from three places, strongest first:
1. *claims*: walkers read the engine's own objects (DeepSpeed flat partitions, optimizer state, IPG
   buckets, grad partition buffers ...) and claim their storages. On a CPU run every tensor lives in RAM,
   so "would be on the GPU" vs "offloaded to host" is decided by which engine object owns a storage and
   how the engine was configured, never by `tensor.device`. A claim also teaches the tracker the
   allocation site that made the storage, so the next step's allocation from the same site is labelled
   correctly from birth.
2. *site rules*: known DeepSpeed/torch functions whose allocations are transients of a known kind.
3. *context*: the phase (forward -> activations, ...) and whether the LM head/loss is running.
"""
from __future__ import annotations

import sys
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from types import FrameType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.breakdown import CATEGORIES

SIDES = ("device", "host")
BIG = 64 * 1024  # allocations at least this large get their own site in peak reports
_SKIP_FUNCS = {"wrapped_fn", "decorate_context", "_call_impl", "_wrapped_call_impl", "wrapper", "inner", "_fn"}
# only engine-made storages teach their site (model construction sites must stay "host while building")
LEARNABLE = ("deepspeed/", "optim/", "distributed/", "parallel/")
# ... and not the engine frames that merely call the model or autograd: everything forward/backward
# allocates (activations, their grads, raw param grads) has these as its innermost engine frame
NOT_LEARNABLE = ("runtime/engine.py:forward", "runtime/engine.py:backward", "runtime/engine.py:__call__",
                 "zero/linear.py:", "parallel/distributed.py:forward", "parallel/distributed.py:_run_ddp_forward")
_CAST_OPS = {"aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy"}
# a step number, or a label within one (litgpt_ranks.py: "3.L0", step 3 from layer 0's backward on)
Step = int | str
# Scratch of the CPU collective backend that a GPU run does not have: gloo's reduce-scatter clones its whole
# input and all-reduces the clone (ProcessGroupGloo.cpp::reduce_scatter_tensor_coalesced); NCCL reduces into
# the output. The clone shows up as the chunk views the calling thread takes of it; it is not counted.
BACKEND_SCRATCH = ("distributed/distributed_c10d.py:reduce_scatter_single",)


@dataclass
class Entry:
    nbytes: int
    category: str
    side: str
    site: str
    sticky: bool = False
    pinned: bool = False
    name: str = ""


@dataclass
class Snapshot:
    total: int
    parts: dict[str, int]
    sites: dict[str, int] = field(default_factory=dict)  # "category|site" -> bytes (big allocations only)


# Site rules: (substring of the innermost engine frame "file:function", category, side). First match wins.
# Each names a transient whose kind is clear from the function that makes it (see FINDINGS.md).
SITE_RULES: list[tuple[str, str, str]] = [
    ("stage_1_and_2.py:setup_buckets", "engine_buffers", "device"),  # IPG bucket(s), made at the first grad hook
    ("stage_1_and_2.py:initialize_optimizer_states", "gradients", "device"),  # fp32 grad partition (init)
    ("fp16/fused_optimizer.py:", "gradients", "device"),  # fp32 flat grads built in step / dummy init step
    # ZeRO-1/2 offload grad hooks: fp32 copies of a param's grad slice on their way to the host buffer
    ("stage_1_and_2.py:async_inplace_copy_grad_to_fp32_buffer_from_gpu", "gradients", "device"),
    ("stage_1_and_2.py:set_norm_for_param_grad", "gradients", "device"),
    ("stage_1_and_2.py:async_accumulate_grad_in_cpu_via_gpu", "gradients", "device"),
    ("stage_1_and_2.py:_restore_cpu_offload_grad_to_gpu", "gradients", "device"),
    ("stage3.py:_prepare_fp32_grad_for_sub_group", "gradients", "device"),
    ("stage3.py:__avg_scatter", "engine_buffers", "device"),
    ("stage3.py:_constant_buffered_norm2", "engine_buffers", "device"),
    ("stage_1_and_2.py:step", "gradients", "device"),
    ("stage_1_and_2.py:get_flat_partition", "gradients", "device"),
    ("stage_1_and_2.py:get_all_grad_tensors", "gradients", "device"),
    ("stage_1_and_2.py:_build_compact_grad_partition_buffer", "gradients", "device"),
    ("stage_1_and_2.py:copy_grads_in_partition", "gradients", "device"),
    ("stage_1_and_2.py:average_tensor", "engine_buffers", "device"),
    ("stage_1_and_2.py:allreduce", "engine_buffers", "device"),
    ("partition_parameters.py:", "weights", "device"),  # ZeRO-3 all-gather of params (working set)
    ("partitioned_param_coordinator.py:", "weights", "device"),
    ("fused_optimizer.py:step", "gradients", "device"),
    ("engine.py:allreduce", "engine_buffers", "device"),
    ("engine.py:buffered_allreduce", "engine_buffers", "device"),
    ("comm/", "engine_buffers", "device"),
    ("ops/adam/cpu_adam.py", "optimizer_states", "host"),  # DeepSpeedCPUAdam state (lazy, unpinned)
    ("ops/adam/fused_adam.py", "optimizer_states", "device"),
    ("_fsdp_param.py:init_all_gather_outputs", "weights", "device"),  # FSDP2 unsharded params (resized 0 <-> full)
    ("_fsdp_param.py:init_unsharded_param", "weights", "device"),
    ("_fully_shard/_fsdp_collectives.py:", "engine_buffers", "device"),  # all-gather / reduce-scatter buffers
    ("distributed/distributed_c10d.py:", "engine_buffers", "device"),
    ("optim/", "optimizer_states", "device"),  # torch optimizers' lazily created state
    ("parallel/distributed.py", "engine_buffers", "device"),  # DDP reducer buckets
]


class MemoryTracker(TorchDispatchMode):
    def __init__(self, roots: tuple[str, ...] = ("/deepspeed/", "/torch/distributed/", "/torch/optim/",
                                                  "/torch/nn/parallel/", "/peft/", "/transformers/")):
        super().__init__()
        self.roots = roots
        self.entries: dict[int, Entry] = {}
        self.live: dict[tuple[str, str], int] = defaultdict(int)
        self.side_total = {"device": 0, "host": 0}
        self.site_live: dict[tuple[str, str], int] = defaultdict(int)  # (side, "category|site") -> bytes
        self.learned: dict[str, tuple[str, str]] = {}
        self.ambiguous: set[str] = set()  # sites claimed with two different labels: never learned
        self.rules = list(SITE_RULES)  # runners prepend rules that depend on the engine's configuration
        self.context: str | None = None  # "logits" inside LM head + loss; "build" while constructing a model
        self.phase = "load"
        self.step: Step = 0
        self.record = True
        self.peaks: dict[tuple[Step, str, str], Snapshot] = {}
        self.pinned_peak = 0
        self.pinned_live = 0
        self.claimed: dict[str, dict] = {}  # name -> {category, side, tensors: [(key, view_bytes, dtype)]}

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self._see(out, func, args)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._see(t, func, args)
                elif isinstance(t, (tuple, list)):
                    for u in t:
                        if isinstance(u, torch.Tensor):
                            self._see(u, func, args)
        return out

    def _see(self, t: torch.Tensor, func, args) -> None:
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            local = getattr(t, "_local_tensor", None)  # DTensor (FSDP2): its local shard holds the memory
            if local is None or type(local) not in (torch.Tensor, torch.nn.Parameter):
                return
            t = local
        if t.device.type == "meta":
            return
        try:
            storage = t.untyped_storage()
            key = storage._cdata  # the StorageImpl: stable across resize_ (FSDP2), unlike data_ptr
            nbytes = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        entry = self.entries.get(key)
        if entry is None and nbytes == 0:
            return
        if entry is not None:
            if entry.nbytes != nbytes:  # storage resized in place (resize_ / set_)
                self._resize(entry, nbytes)
            return
        site = self._site() if nbytes >= BIG else "<small>"
        if site.startswith(BACKEND_SCRATCH) and t.device.type == "cpu":
            return
        category, side = self._initial_label(site, func, args)
        self._add(key, storage, Entry(nbytes, category, side, site))

    # ---------------------------------------------------------------- labelling
    def _site(self) -> str:
        """Innermost frame in engine/model code plus its nearest such caller: "file:function:line < ..."."""
        frame: FrameType | None = sys._getframe(3)
        found: list[str] = []
        while frame is not None and len(found) < 2:
            code = frame.f_code
            filename = code.co_filename
            if code.co_name not in _SKIP_FUNCS and "/memfit/measure/" not in filename and "/nvtx.py" not in filename:
                root = next((r for r in self.roots if r in filename), None)
                if root is not None:
                    short = filename.split(root, 1)[1]
                    found.append(f"{root.strip('/').split('/')[-1]}/{short}:{code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return " < ".join(found) if found else "<user>"

    def _initial_label(self, site: str, func=None, args=()) -> tuple[str, str]:
        if self.context == "build":
            return "weights", "host"
        if self.context == "checkpoint_load":  # torch.load(map_location=cpu): host RAM, refined by claim_loaded
            return "engine_buffers", "host"
        if site in self.learned:
            return self.learned[site]
        head = site.split(" < ", 1)[0]
        for text in (head, site):
            for pattern, category, side in self.rules:
                if pattern in text:
                    return category, side
        if self.context == "logits":
            return "logits_loss", "device"
        if self.phase == "forward" and func is not None and str(func) in _CAST_OPS and args:
            source = args[0]
            if isinstance(source, torch.Tensor):  # autocast's low-precision copy of a weight
                owner = self.entries.get(source.untyped_storage()._cdata)
                if owner is not None and owner.category == "weights":
                    return "weights", owner.side
        if self.phase in ("forward", "backward"):
            return "activations", "device"
        return "engine_buffers", "device"

    def _add(self, key: int, storage, entry: Entry) -> None:
        self.entries[key] = entry
        self._count(entry, +1)
        weakref.finalize(storage, self._drop, key, entry)
        self._check_peak()

    def _drop(self, key: int, entry: Entry) -> None:
        if self.entries.get(key) is entry:
            del self.entries[key]
            self._count(entry, -1)

    def _count(self, entry: Entry, sign: int) -> None:
        n = sign * entry.nbytes
        self.live[(entry.side, entry.category)] += n
        self.side_total[entry.side] += n
        self.site_live[(entry.side, f"{entry.category}|{entry.site}")] += n
        if entry.pinned and entry.side == "host":  # what would be page-locked host RAM on a GPU machine
            self.pinned_live += n

    def _resize(self, entry: Entry, nbytes: int) -> None:
        self._count(entry, -1)
        entry.nbytes = nbytes
        self._count(entry, +1)
        self._check_peak()

    def _check_peak(self, relabel: bool = False) -> None:
        self.pinned_peak = max(self.pinned_peak, self.pinned_live)
        if not self.record:
            return
        for side in SIDES:
            total = self.side_total[side]
            key = (self.step, self.phase, side)
            best = self.peaks.get(key)
            # after a relabel at the peak moment, the same total gets the corrected categories
            if best is None or total > best.total or (relabel and total == best.total):
                self.peaks[key] = Snapshot(
                    total,
                    {c: self.live[(side, c)] for c in CATEGORIES if self.live.get((side, c))},
                    {s: b for (sd, s), b in self.site_live.items() if sd == side and b >= BIG},
                )

    # ---------------------------------------------------------------- public API
    def set_phase(self, phase: str, step: Step | None = None) -> None:
        self.phase = phase
        if step is not None:
            self.step = step
        self._check_peak()  # a phase starts at the level the previous one left

    def claim(self, tensor, category: str, side: str, name: str, learn: bool = True) -> None:
        """Label the storage behind `tensor` as engine object `name`; sticky against later guesses."""
        if tensor is None or not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        if hasattr(tensor, "_local_tensor"):  # DTensor (FSDP2): its local shard
            tensor = tensor._local_tensor
        try:
            storage = tensor.untyped_storage()
            key = storage._cdata
            nbytes = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        record = self.claimed.setdefault(f"{name}@{side}", {"name": name, "category": category, "side": side, "tensors": {}})
        view = (key, tensor.storage_offset(), tensor.numel())  # not id(): `p.data` is a new object each call
        record["tensors"][view] = (key, tensor.numel() * tensor.element_size(), str(tensor.dtype).replace("torch.", ""))
        entry = self.entries.get(key)
        if entry is None and nbytes == 0:
            return
        if entry is None:  # made outside the dispatcher (torch.load, from_buffer ...)
            self._add(key, storage, Entry(nbytes, category, side, "<claimed>", sticky=True, name=f"{name}@{side}"))
            return
        if entry.nbytes != nbytes:
            self._resize(entry, nbytes)
        if (entry.category, entry.side) != (category, side):
            self._count(entry, -1)
            entry.category, entry.side = category, side
            self._count(entry, +1)
        entry.sticky, entry.name = True, f"{name}@{side}"
        if learn and entry.site.startswith(LEARNABLE) and not any(x in entry.site.split(" < ")[0] for x in NOT_LEARNABLE):
            known = self.learned.get(entry.site)
            if entry.site in self.ambiguous or (known is not None and known != (category, side)):
                # one line of code making objects of two kinds (ZeRO-3 sub-groups on device and on host)
                self.ambiguous.add(entry.site)
                self.learned.pop(entry.site, None)
            else:
                self.learned[entry.site] = (category, side)
        self._check_peak(relabel=True)

    def soft_claim(self, tensor, category: str, side: str) -> None:
        """Label unless an engine object already claimed the storage (used by grad hooks)."""
        if tensor is None:
            return
        if hasattr(tensor, "_local_tensor"):
            tensor = tensor._local_tensor
        try:
            entry = self.entries.get(tensor.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return
        if entry is None or entry.sticky or (entry.category, entry.side) == (category, side):
            return
        self._count(entry, -1)
        entry.category, entry.side = category, side
        self._count(entry, +1)
        self._check_peak(relabel=True)

    def refresh(self, tensor) -> None:
        """Re-read a storage's size after a resize outside the dispatcher (FSDP2 alloc/free_storage)."""
        try:
            storage = tensor.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        entry = self.entries.get(key)
        if entry is None:
            if nbytes:
                site = self._site() if nbytes >= BIG else "<small>"
                self._add(key, storage, Entry(nbytes, *self._initial_label(site), site))
        elif entry.nbytes != nbytes:
            self._resize(entry, nbytes)

    def mark_pinned(self, tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        try:
            entry = self.entries.get(tensor.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return
        if entry is not None and not entry.pinned:
            self._count(entry, -1)
            entry.pinned = True
            self._count(entry, +1)
            self._check_peak()

    def reset_claims(self) -> None:
        self.claimed = {}

    def named_buffers(self) -> list[dict]:
        """Claimed engine objects still alive: name, category, side, view bytes and storage bytes."""
        out = []
        for record in self.claimed.values():
            name = record["name"]
            keys, view_bytes, dtypes, pinned = set(), 0, set(), False
            for key, vb, dtype in record["tensors"].values():
                entry = self.entries.get(key)
                if entry is None:
                    continue
                keys.add(key)
                view_bytes += vb
                dtypes.add(dtype)
                pinned = pinned or (entry.pinned and entry.side == "host")
            if not keys:
                continue
            out.append({
                "name": name, "category": record["category"], "side": record["side"], "bytes": view_bytes,
                "storage_bytes": sum(self.entries[k].nbytes for k in keys), "count": len(record["tensors"]),
                "pinned": pinned, "dtype": ",".join(sorted(dtypes)),
            })
        return sorted(out, key=lambda b: (b["side"], b["category"], b["name"]))

    def live_by_label(self) -> dict[str, dict[str, int]]:
        return {side: {c: self.live.get((side, c), 0) for c in CATEGORIES} for side in SIDES}
