"""The peak of each phase of a step (forward, backward, optimizer_step, ...), for MemoryMonitor's phase marks.

At each mark the peak since the previous mark is read and the peak counter reset, so the value read belongs to
the phase that the mark ends:
- CUDA: torch.cuda.max_memory_allocated, then reset_peak_memory_stats (the allocator's own counters, no sync);
- CPU: the process's RSS high-water mark (VmHWM), then reset through /proc/self/clear_refs: malloc's bytes in use
  at a mark would miss what a phase allocates and frees inside itself (the optimizer's temporaries), the
  high-water mark does not. It costs a page-table walk per mark (see bench/monitor.py).
Resetting the counters at marks would hide earlier peaks from the step's own peak: the clock keeps the highest
value it read so the step's line still carries the step's (or, on the CPU by default, the run's) peak."""
from __future__ import annotations

import sys


class PhaseClock:
    def __init__(self, cuda: bool, host):
        self.cuda = cuda
        self.host = host  # probes.HostReader
        self.current: str | None = None
        self.peaks: dict[str, int] = {}  # phase -> its highest peak since the last written line
        self.window: int | None = None  # highest peak read at a mark since the last written line
        self.ever: int | None = None  # highest read at any mark (the CPU's since-start peak survives resets)

    def _read_and_reset(self) -> int | None:
        if self.cuda:
            torch = sys.modules["torch"]  # cuda in use: the run imported torch
            peak = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            return peak
        return self.host.peak_rss(reset=True)

    def mark(self, name: str | None) -> None:
        """End the phase running now (if any) and start `name` (None: none)."""
        if name is None and self.current is None:
            return  # a step without marks reads nothing here: no cost for loops that mark no phase
        peak = self._read_and_reset()
        if peak is not None:
            self.window = peak if self.window is None else max(self.window, peak)
            self.ever = peak if self.ever is None else max(self.ever, peak)
            if self.current is not None:
                self.peaks[self.current] = max(self.peaks.get(self.current, 0), peak)
        self.current = name

    def with_window(self, peak: int | None, per_step: bool) -> int | None:
        """The step's peak: what the counter says now, or higher if a mark read more since the last line
        (per_step) or since start."""
        seen = self.window if per_step else self.ever
        if peak is None or seen is None:
            return peak if seen is None else seen
        if not per_step:
            self.ever = max(seen, peak)  # seen is self.ever here
        return max(peak, seen)

    def take(self) -> dict[str, int]:
        """The phases' peaks for the line being written; the next line starts afresh."""
        peaks, self.peaks, self.window = self.peaks, {}, None
        return peaks
