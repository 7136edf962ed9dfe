"""Count live tensor storage bytes the way the CUDA caching allocator reports them.

`torch.cuda.max_memory_allocated` is the peak of the sum of live blocks, each block a storage rounded
up to 512 bytes (`kMinBlockSize` in c10/cuda/CUDACachingAllocator.cpp). Views share their base's
storage, so a storage is counted once, from the op that created it until it dies. The `Accountant`
sees every op below autograd (a TorchDispatchMode), registers each new output storage with a
weakref callback that fires when the storage is freed, and tags it with a memory category and the
phase of the step it was allocated in. The same mode works on fake tensors (no memory at all) and on
real CPU tensors, which is how the fake trace is checked against a real run.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memfit.breakdown import CATEGORIES, Breakdown, PhaseProfile

BLOCK_BYTES = 512  # c10/cuda/CUDACachingAllocator.cpp kMinBlockSize: every block is a multiple of 512 B
RECENT = 16  # allocations remembered at a peak, to re-label gradients that were still "in flight"
TRAINING_PHASES = ("forward", "backward", "optimizer_step")
_TO_COPY = torch.ops.aten._to_copy.default


def block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of `nbytes` (0 stays 0)."""
    return -(-int(nbytes) // BLOCK_BYTES) * BLOCK_BYTES


@dataclass
class _Storage:
    serial: int
    nbytes: int  # already rounded to blocks
    category: str
    phase: str
    alive: bool = True
    excluded: bool = False  # host memory in a CUDA run: tracked, never counted
    origin: str = ""  # op, shape and dtype of the tensor that created it (debug mode only)


@dataclass
class _Peak:
    total: int = -1
    parts: dict[str, int] = field(default_factory=dict)
    tick: int = 0
    recent: list[tuple[int, int, str]] = field(default_factory=list)  # (serial, bytes, category)


@dataclass(frozen=True)
class TimelinePoint:
    tick: int  # index of the op that allocated (monotonic over the whole trace)
    step: int
    phase: str
    parts: tuple[int, ...]  # live bytes per category, in CATEGORIES order

    @property
    def total(self) -> int:
        return sum(self.parts)


class Accountant(TorchDispatchMode):
    """Live storage bytes by category, per-phase peaks, and a timeline.

    The runner drives it: `phase` and `region` say how to label new allocations; `label()` re-labels
    existing storages (parameters as weights, `.grad` as gradients, optimizer state);
    `exclude()` drops storages that would live on the host in a CUDA run.
    """

    def __init__(self, debug: bool = False) -> None:
        super().__init__()
        self.debug = debug
        self._op = ""
        self._live: dict[int, _Storage] = {}  # id(storage object) -> record
        self._refs: dict[int, weakref.ref] = {}
        self._by_cat = dict.fromkeys(CATEGORIES, 0)
        self._serial = 0
        self._tick = 0
        self._recent: list[_Storage] = []
        self._paused = 0
        self._relabelled: dict[int, str] = {}  # serial -> final category (gradients found after their peak)
        self.phase = "forward"
        self.region = "activations"  # category of new allocations in forward/backward
        self.step = 0
        self.peaks: dict[str, _Peak] = {}
        self.marks: dict[str, Breakdown] = {}
        self.timeline: list[TimelinePoint] = []
        self.inspect: Callable[[str, Accountant], None] | None = None  # optional: the runner calls it at marks
        # opt-in event recorder (memfit.trace.allocator replays it): a list to append (+1 | -1, serial, raw
        # storage bytes, record) to at every allocation and free; None (the default) records nothing
        self.events: list | None = None

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.debug:
            self._op = str(func)
        if not self._paused:
            category = self._default_category()
            if func is _TO_COPY and isinstance(args[0], torch.Tensor):
                source = self._record(args[0])
                if source is not None and source.category == "weights":
                    category = "weights"  # a cast copy of a parameter (autocast weight cache, ...)
            grew = False
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    grew |= self._track(t, category)
            if grew:
                self._after_allocation()
        return out

    def _default_category(self) -> str:
        return "optimizer_states" if self.phase == "optimizer_step" else self.region

    # ---------------------------------------------------------------- storages
    def _track(self, t: torch.Tensor, category: str) -> bool:
        """Register t's storage if new (or re-measure it if resized); True if live bytes grew."""
        st = t.untyped_storage()
        key = id(st)
        rec = self._live.get(key)
        nbytes = block_bytes(st.nbytes())
        if rec is not None:
            if rec.excluded or rec.nbytes == nbytes:
                return False
            self._by_cat[rec.category] += nbytes - rec.nbytes
            grew = nbytes > rec.nbytes
            if self.events is not None:  # a resize is a free and a new allocation to the allocator
                self.events += [(-1, rec.serial, 0, rec), (1, rec.serial, st.nbytes(), rec)]
            rec.nbytes = nbytes
            return grew
        self._serial += 1
        rec = _Storage(self._serial, nbytes, category, self.phase)
        if self.debug:
            rec.origin = f"{self._op} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        self._live[key] = rec
        self._refs[key] = weakref.ref(st, self._make_free(key, rec))
        self._by_cat[category] += nbytes
        if self.events is not None:
            self.events.append((1, rec.serial, st.nbytes(), rec))
        if nbytes:
            self._recent.append(rec)
            if len(self._recent) > RECENT:
                del self._recent[0]
        return nbytes > 0

    def _make_free(self, key: int, rec: _Storage):
        def free(_ref) -> None:
            rec.alive = False
            if self.events is not None:
                self.events.append((-1, rec.serial, 0, rec))
            if self._live.get(key) is rec:
                del self._live[key]
                del self._refs[key]
                self._by_cat[rec.category] -= rec.nbytes
        return free

    def _record(self, t: torch.Tensor) -> _Storage | None:
        return self._live.get(id(t.untyped_storage()))

    def register(self, t: torch.Tensor, category: str) -> None:
        """Track a tensor created outside the mode (parameters built before the trace starts)."""
        if self._record(t) is None:
            self._track(t, category)
        else:
            self.label(t, category)

    def label(self, t: torch.Tensor, category: str) -> None:
        """Re-label a live storage (a `.grad` that was allocated as a backward temporary, ...)."""
        rec = self._record(t)
        if rec is None:
            self._track(t, category)
            return
        if rec.category != category:
            self._by_cat[rec.category] -= rec.nbytes
            self._by_cat[category] += rec.nbytes
            rec.category = category
            if category == "gradients":
                self._relabelled[rec.serial] = category

    def exclude(self, t: torch.Tensor) -> None:
        """Stop counting a storage: it would be host memory on a CUDA machine (optimizer `step` scalars)."""
        rec = self._record(t)
        if rec is not None:
            self._by_cat[rec.category] -= rec.nbytes
            rec.nbytes = 0
            rec.excluded = True
            if self.events is not None:  # host memory: gone from the device's point of view
                self.events.append((-1, rec.serial, 0, rec))

    def host(self, t: torch.Tensor) -> torch.Tensor:
        """Mark a freshly made tensor as host memory (offloaded activations): tracked at 0 bytes."""
        rec = self._record(t)
        if rec is None:
            self._track(t, "activations")
            rec = self._record(t)
        self.exclude(t)
        return t

    @contextmanager
    def paused(self):
        """Allocations inside are invisible (real-valued reference math inside emulated kernels)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    # ---------------------------------------------------------------- peaks and timeline
    @property
    def live_bytes(self) -> int:
        return sum(self._by_cat.values())

    def snapshot(self) -> Breakdown:
        return Breakdown({c: b for c, b in self._by_cat.items() if b})

    def _after_allocation(self) -> None:
        self._tick += 1
        parts = tuple(self._by_cat[c] for c in CATEGORIES)
        self.timeline.append(TimelinePoint(self._tick, self.step, self.phase, parts))
        total = sum(parts)
        key = f"{self.step}:{self.phase}"
        peak = self.peaks.get(key)
        if peak is None or total > peak.total:
            recent = [(r.serial, r.nbytes, r.category) for r in self._recent if r.alive and r.nbytes]
            self.peaks[key] = _Peak(total, dict(self._by_cat), self._tick, recent)

    def enter_phase(self, phase: str, step: int | None = None) -> None:
        if step is not None:
            self.step = step
        self.phase = phase
        self.region = "activations"
        key = f"{self.step}:{phase}"
        total = self.live_bytes
        # the phase starts from what is already live: that is its floor
        if key not in self.peaks or total > self.peaks[key].total:
            self.peaks[key] = _Peak(total, dict(self._by_cat), self._tick, [])

    def mark(self, name: str) -> None:
        """Remember the breakdown at a named moment (end of forward, end of backward, ...)."""
        self.marks[name] = self.snapshot()

    def live(self, category: str | None = None) -> list[tuple[int, str, str]]:
        """(bytes, category, origin) of every live storage, largest first (origins need debug=True)."""
        recs = [r for r in self._live.values() if r.nbytes and (category is None or r.category == category)]
        return sorted(((r.nbytes, r.category, r.origin) for r in recs), reverse=True)

    def profile(self, step: int) -> PhaseProfile:
        """Per-phase peak breakdowns of one step, with in-flight gradients labelled as gradients."""
        phases = {}
        for phase in TRAINING_PHASES:
            peak = self.peaks.get(f"{step}:{phase}")
            if peak is None:
                continue
            parts = dict(peak.parts)
            for serial, nbytes, category in peak.recent:
                final = self._relabelled.get(serial)
                if final and final != category:
                    parts[category] -= nbytes
                    parts[final] = parts.get(final, 0) + nbytes
            phases[phase] = Breakdown({c: b for c, b in parts.items() if b})
        return PhaseProfile(phases)

    def peak_tick(self, step: int, phase: str) -> int:
        peak = self.peaks.get(f"{step}:{phase}")
        return peak.tick if peak else 0
