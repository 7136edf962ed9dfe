"""A replay of PyTorch's CUDA caching allocator over a stream of allocations and frees, on any machine.

`torch.cuda.memory_reserved` is what the caching allocator (c10/cuda/CUDACachingAllocator.cpp) has taken from
the driver; `memory_allocated` the blocks it has handed out. Reserved exceeds allocated by the free blocks it
keeps cached, and how much depends on the order and sizes of requests, not on their sum: this module runs the
allocator's rules (torch 2.13, default settings: no expandable segments, no max_split_size, no garbage
collection threshold, one stream) over a recorded stream and reports both peaks and where it would run out.

The rules, with c10's constants (each is checked by tests/trace/test_allocator.py):
  R1 rounding    a request of n > 0 bytes becomes a multiple of kMinBlockSize = 512 (0 bytes takes no block).
  R2 pools       rounded sizes <= kSmallSize = 1 MiB come from the small pool, larger ones from the large pool;
                 a block never moves between pools.
  R3 segments    a new segment (one cudaMalloc) is kSmallBuffer = 2 MiB for the small pool, kLargeBuffer = 20 MiB
                 for requests < kMinLargeAlloc = 10 MiB, else the request rounded up to kRoundLarge = 2 MiB.
  R4 best fit    the free block of the pool with the smallest size >= the request (the lowest address among
                 equal sizes); with max_split_size set, a request below it never takes a block at or above it
                 and a request at or above it never takes a block >= request + 20 MiB.
  R5 split       the request takes the low end of the block; the rest becomes a free block only if it is >= 512 B
                 (small pool) or > 1 MiB (large pool, and request < max_split_size); otherwise the whole block is
                 handed out and counted as allocated.
  R6 merge       a freed block merges with free neighbours of its own segment.
  R7 growth      no free block fits -> a new segment, if the device has room.
  R8 retry       no room -> release every cached segment that is wholly free (both pools; with max_split_size,
                 first only the oversize ones) and try once more; still no room -> out of memory.
  R9 counters    allocated = sum of handed-out block sizes, reserved = sum of segment sizes; nothing is returned
                 to the driver except by R8 or empty_cache().
Addresses are virtual: segments are laid out in the order they are made (the driver's real addresses only
break ties between equal-size free blocks in R4).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from memfit.errors import MemfitError

KiB, MiB = 1024, 1024 * 1024
TORCH_VERSION = "2.13.0"  # the c10 release whose rules (and constants below) this replays


@dataclass(frozen=True)
class Rules:
    min_block: int = 512  # kMinBlockSize
    small_size: int = 1 * MiB  # kSmallSize: largest request of the small pool
    small_buffer: int = 2 * MiB  # kSmallBuffer: small-pool segment
    large_buffer: int = 20 * MiB  # kLargeBuffer: segment for large requests < kMinLargeAlloc
    min_large_alloc: int = 10 * MiB  # kMinLargeAlloc
    round_large: int = 2 * MiB  # kRoundLarge
    max_split_size: int | None = None  # PYTORCH_CUDA_ALLOC_CONF max_split_size_mb (None: unlimited, the default)

    def round_size(self, n: int) -> int:
        return 0 if n <= 0 else -(-n // self.min_block) * self.min_block

    def is_small(self, rounded: int) -> bool:
        return rounded <= self.small_size

    def segment_size(self, rounded: int) -> int:
        if self.is_small(rounded):
            return self.small_buffer
        if rounded < self.min_large_alloc:
            return self.large_buffer
        return -(-rounded // self.round_large) * self.round_large

    def should_split(self, small: bool, block: int, request: int) -> bool:
        rest = block - request
        if small:
            return rest >= self.min_block
        return (self.max_split_size is None or request < self.max_split_size) and rest > self.small_size

    def may_take(self, request: int, block: int) -> bool:
        mss = self.max_split_size
        if mss is None:
            return True
        if request < mss:
            return block < mss
        return block < request + self.large_buffer


DEFAULT_RULES = Rules()


@dataclass(eq=False, slots=True)
class _Block:
    addr: int
    size: int
    seg: "_Segment"
    allocated: bool = False


@dataclass(eq=False, slots=True)
class _Segment:
    addr: int
    size: int
    small: bool


@dataclass(frozen=True)
class OutOfMemory:
    event: int  # index of the failing event in the replayed stream
    request: int  # bytes asked for (before rounding)
    allocated: int
    reserved: int  # after the R8 release: what torch's message calls "reserved in total by PyTorch"

    @property
    def reserved_unallocated(self) -> int:
        return self.reserved - self.allocated


class CachingAllocator:
    """One device's caching allocator (one stream). `capacity` None = unlimited device memory."""

    SEGMENT_GAP = 512  # virtual space between segments, so blocks of two segments are never neighbours

    def __init__(self, capacity: int | None = None, rules: Rules = DEFAULT_RULES) -> None:
        self.capacity, self.rules = capacity, rules
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.segments_made = self.releases = 0
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # small? -> sorted (size, addr)
        self._start: dict[int, _Block] = {}
        self._end: dict[int, _Block] = {}
        self._next_addr = 0

    # ------------------------------------------------------------------ public
    def malloc(self, n: int) -> int | None:
        """Hand out a block for n bytes: its address, -1 for n == 0, None when out of memory."""
        size = self.rules.round_size(n)
        if size == 0:
            return -1
        small = self.rules.is_small(size)
        block = self._best_fit(small, size)
        if block is None:
            block = self._new_segment(small, size)
        if block is None:
            return None
        self._take(block, size)
        return block.addr

    def free(self, addr: int) -> None:
        if addr == -1:
            return
        block = self._start[addr]
        if not block.allocated:
            raise MemfitError(f"allocator replay: double free at {addr}")
        block.allocated = False
        self.allocated -= block.size
        block = self._merge(block)
        self._cache(block)

    def empty_cache(self) -> int:
        """torch.cuda.empty_cache / the R8 release: give back every wholly free segment; bytes released."""
        released = 0
        for small in (True, False):
            for _, addr in list(self._free[small]):
                block = self._start[addr]
                if block.addr == block.seg.addr and block.size == block.seg.size:
                    self._uncache(block)
                    del self._start[block.addr], self._end[block.addr + block.size]
                    self.reserved -= block.size
                    released += block.size
        return released

    def block_size(self, addr: int) -> int:
        return 0 if addr == -1 else self._start[addr].size

    @property
    def cached_free(self) -> int:
        return self.reserved - self.allocated

    # ------------------------------------------------------------------ rules
    def _best_fit(self, small: bool, size: int) -> _Block | None:
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool) or not self.rules.may_take(size, pool[i][0]):
            return None  # R4: c10 looks at the first candidate only
        return self._start[pool[i][1]]

    def _new_segment(self, small: bool, size: int) -> _Block | None:
        seg_size = self.rules.segment_size(size)
        if not self._room(seg_size):
            if self.rules.max_split_size is not None:
                self._release_oversize(size)
            if not self._room(seg_size):
                self.releases += 1
                self.empty_cache()
                if not self._room(seg_size):
                    return None
        seg = _Segment(self._next_addr, seg_size, small)
        self._next_addr += seg_size + self.SEGMENT_GAP
        self.reserved += seg_size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments_made += 1
        block = _Block(seg.addr, seg_size, seg)
        self._start[block.addr], self._end[block.addr + seg_size] = block, block
        self._cache(block)
        return block

    def _room(self, seg_size: int) -> bool:
        return self.capacity is None or self.reserved + seg_size <= self.capacity

    def _release_oversize(self, size: int) -> None:
        """c10 release_available_cached_blocks (max_split_size only): free oversize whole segments, largest first."""
        mss = self.rules.max_split_size
        if mss is None:  # no size is oversize
            return
        for bsize, addr in sorted(self._free[False], reverse=True):
            block = self._start[addr]
            if bsize >= mss and block.size == block.seg.size and not self._room(self.rules.segment_size(size)):
                self._uncache(block)
                del self._start[block.addr], self._end[block.addr + block.size]
                self.reserved -= block.size

    def _take(self, block: _Block, size: int) -> None:
        self._uncache(block)
        if self.rules.should_split(block.seg.small, block.size, size):
            rest = _Block(block.addr + size, block.size - size, block.seg)
            del self._end[block.addr + block.size]
            block.size = size
            self._end[block.addr + size] = block
            self._start[rest.addr], self._end[rest.addr + rest.size] = rest, rest
            self._cache(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def _merge(self, block: _Block) -> _Block:
        prev = self._end.get(block.addr)
        if prev is not None and not prev.allocated and prev.seg is block.seg:
            self._uncache(prev)
            del self._end[prev.addr + prev.size], self._start[block.addr]
            prev.size += block.size
            self._end[prev.addr + prev.size] = prev
            block = prev
        nxt = self._start.get(block.addr + block.size)
        if nxt is not None and not nxt.allocated and nxt.seg is block.seg:
            self._uncache(nxt)
            del self._end[block.addr + block.size], self._start[nxt.addr]
            block.size += nxt.size
            self._end[block.addr + block.size] = block
        return block

    def _cache(self, block: _Block) -> None:
        bisect.insort(self._free[block.seg.small], (block.size, block.addr))

    def _uncache(self, block: _Block) -> None:
        pool = self._free[block.seg.small]
        i = bisect.bisect_left(pool, (block.size, block.addr))
        if i == len(pool) or pool[i] != (block.size, block.addr):
            raise MemfitError(f"allocator replay: free block {block.addr} not in its pool")
        del pool[i]


# ---------------------------------------------------------------------------------------------- replay
@dataclass
class StepLevels:
    label: object
    peak_allocated: int  # within the step
    peak_reserved: int  # within the step (reserved never falls except at a release, so also the step's end)
    allocated_end: int
    reserved_end: int


@dataclass
class Replay:
    peak_allocated: int
    peak_reserved: int
    oom: OutOfMemory | None
    steps: list[StepLevels] = field(default_factory=list)
    releases: int = 0  # R8 releases (free cached segments and retry)
    segments_made: int = 0


class Replayer:
    """A stream fed in pieces (deep-copy it to try continuations from the same state)."""

    def __init__(self, capacity: int | None = None, rules: Rules = DEFAULT_RULES) -> None:
        self.allocator = CachingAllocator(capacity, rules)
        self.addrs: dict = {}
        self.steps: list[StepLevels] = []
        self.oom: OutOfMemory | None = None
        self.seen = 0  # events fed so far
        self._step_alloc = self._step_res = 0

    def feed(self, events) -> OutOfMemory | None:
        """Events: (1, key, nbytes) allocates, (-1, key) frees (an unknown key is ignored: storages that were never
        on the device), ("mark", label) closes a step. Stops at the first OOM and returns it."""
        a = self.allocator
        for ev in events:
            self.seen += 1
            kind = ev[0]
            if kind == 1:
                addr = a.malloc(ev[2])
                if addr is None:
                    self.oom = OutOfMemory(self.seen - 1, ev[2], a.allocated, a.reserved)
                    return self.oom
                self.addrs[ev[1]] = addr
                self._step_alloc, self._step_res = max(self._step_alloc, a.allocated), max(self._step_res, a.reserved)
            elif kind == -1:
                addr = self.addrs.pop(ev[1], None)
                if addr is not None:
                    a.free(addr)
            elif kind == "mark":
                self.steps.append(StepLevels(ev[1], self._step_alloc, self._step_res, a.allocated, a.reserved))
                self._step_alloc, self._step_res = a.allocated, a.reserved
        return None

    def result(self) -> Replay:
        a = self.allocator
        return Replay(a.peak_allocated, a.peak_reserved, self.oom, self.steps, a.releases, a.segments_made)


def replay(events, capacity: int | None = None, rules: Rules = DEFAULT_RULES) -> Replay:
    """Run a whole stream through a fresh allocator (see Replayer.feed for the events); stops at the first OOM."""
    r = Replayer(capacity, rules)
    r.feed(events)
    return r.result()
