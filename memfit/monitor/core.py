"""MemoryMonitor: one JSON line per rank and step with the memory the step used, for `memfit watch`.

    with MemoryMonitor("run.jsonl") as mon:
        for batch in loader:
            ...train step...
            mon.step(tokens=batch["input_ids"].numel())

Phase marks split the step's peak by phase (`"phase_peaks"` in the step's line, absent when none was marked):

            mon.phase("forward");  loss = model(batch).loss
            mon.phase("backward"); loss.backward()
            with mon.phase("optimizer_step"): opt.step()   # or mon.phase(...) alone: it runs to the next mark

It must never break the training it watches: every exception inside it is caught, counted, reported once
on stderr, and the monitor then turns itself off. torch is read from sys.modules or imported inside
functions, so `import memfit.monitor` works without torch."""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Literal

from memfit.breakdown import PHASES
from memfit.monitor import probes
from memfit.monitor.phases import PhaseClock

SCHEMA = "memfit.monitor/1"
# one encoder made once: json.dumps(separators=...) builds a new encoder per call, a third of the step cost
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def contained(method):
    """Run a monitor method so that no exception of the monitor's own reaches the training loop."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if self.disabled:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # the monitor's bug or a full disk must not end a week-long run
            self._fail(e)
            return None
    return run


def rank_path(path: str, rank: int, world_size: int) -> str:
    """One file per rank. Not one shared file with O_APPEND: appends below PIPE_BUF are atomic on a local
    Linux filesystem, but not on NFS or Lustre, where clusters keep their outputs and where ranks on several
    nodes would interleave or overwrite lines. `{rank}` in the path says where the number goes; else a run of
    several ranks writes NAME.rank{N}.jsonl and `memfit watch NAME.jsonl` finds them all."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world_size <= 1:
        return path
    stem = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    return f"{stem}.rank{rank}.jsonl"


class MemoryMonitor:
    """Context manager (or call .step() alone: the first call starts it). `rank` overrides the rank read
    from torch.distributed / RANK; `every` samples every Nth step (the peak then spans those steps). On the CPU
    the peak is the process's RSS high-water mark since it started, or with `cpu_step_peaks` each step's own
    (Linux; ~0.1 ms a step more)."""

    def __init__(self, path, rank: int | None = None, every: int = 1, cpu_step_peaks: bool = False):
        self.path = str(path)
        self.rank = rank
        self.every = max(1, int(every))
        self.cpu_step_peaks = cpu_step_peaks
        self.disabled = False
        self.errors = 0
        self.lines = 0
        self.monitor_seconds = 0.0  # time spent inside step(): the bench divides it by the step time
        self.file: str | None = None
        self._fd: int | None = None
        self._steps = 0
        self._last: float | None = None
        self._host: probes.HostReader | None = None
        self._phases: PhaseClock | None = None  # made at start

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> Literal[False]:
        self.close()
        return False  # the training loop's own exception goes on up

    @contained
    def start(self) -> None:
        if self._fd is not None:
            return
        rank, self.world_size = probes.distributed_rank()
        self.rank = rank if self.rank is None else int(self.rank)
        self.cuda = probes.cuda_in_use()
        self.device_total = probes.cuda_total_bytes() if self.cuda else None
        self._host = probes.HostReader()
        if not self.cuda and self.cpu_step_peaks:
            self._host.peak_rss(reset=True)  # the first step's peak starts here, not at process start
        self.file = rank_path(self.path, self.rank, self.world_size)
        self._fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._phases = PhaseClock(self.cuda, self._host)
        self._last = time.perf_counter()

    def phase(self, name: str) -> "_PhaseMark":
        """Start phase `name` (one of memfit's phases: load, forward, backward, optimizer_step, checkpoint_save,
        resume); it runs to the next mark, to the end of a `with` block, or to step(). A phase marked several
        times in a step (gradient accumulation's micro-batches) keeps its highest peak."""
        self._mark(name)
        return _PhaseMark(self)

    @contained
    def _mark(self, name) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; memfit's phases are {', '.join(PHASES)}")
        if self._fd is None:
            self.start()
        if self._phases is not None:
            self._phases.mark(name)

    @contained
    def end_phase(self) -> None:
        """End the phase running now without starting another (what follows counts in the step's peak only)."""
        if self._phases is not None:
            self._phases.mark(None)

    @contained
    def step(self, tokens=None) -> None:
        """Call once per optimizer step, after it; `tokens` is the step's token count on this rank (padded
        tokens count: they take memory too), or None."""
        begin = time.perf_counter()
        if self._fd is None:
            self.start()
            if self._fd is None:
                return
        self._steps += 1
        assert self._last is not None and self._phases is not None, "start() set them with the file"
        seconds, self._last = begin - self._last, begin
        self._phases.mark(None)  # the phase running now ends with the step
        if self._steps % self.every == 0:
            self._write(self._sample(self._steps, seconds, None if tokens is None else int(tokens)))
        self.monitor_seconds += time.perf_counter() - begin

    def _sample(self, step: int, seconds: float, tokens: int | None) -> dict:
        line: dict[str, object] = {"schema": SCHEMA, "rank": self.rank, "world_size": self.world_size, "step": step,
                                   "time": time.time(), "step_seconds": round(seconds, 6), "tokens": tokens}
        clock, host = self._phases, self._host
        assert clock is not None and host is not None, "start() makes them before the first step"
        if self.cuda:
            cuda = probes.cuda_sample()
            # phase marks reset torch's peak: the step's peak is also the highest one read at a mark
            cuda["peak_allocated_bytes"] = clock.with_window(cuda["peak_allocated_bytes"], per_step=True)
            line.update(device_kind="cuda", **cuda, allocated_source="cuda", host_peak_rss_bytes=None)
        else:
            # the CPU is the device: malloc's bytes in use are the live tensors; the peak is the RSS high-water
            # mark (there is no allocator peak to read), and nothing is "reserved" as on CUDA
            allocated = host.malloc_in_use()
            peak = clock.with_window(host.peak_rss(reset=self.cpu_step_peaks), per_step=self.cpu_step_peaks)
            line.update(device_kind="cpu", allocated_bytes=allocated, reserved_bytes=None,
                        peak_allocated_bytes=None, allocated_source="malloc" if allocated is not None else None,
                        host_peak_rss_bytes=peak)
        line.update(device_total_bytes=self.device_total, host_rss_bytes=host.rss())
        peaks = clock.take()
        if peaks:
            line["phase_peaks"] = peaks
        return line

    def _write(self, line: dict) -> None:
        assert self._fd is not None, "only an open monitor writes"
        data = (_ENCODE(line) + "\n").encode()
        while data:  # one write per line; the loop only matters if the OS writes part of it
            data = data[os.write(self._fd, data):]
        self.lines += 1

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if self._host is not None:
            self._host.close()
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _fail(self, e: Exception) -> None:
        self.errors += 1
        if not self.disabled:
            print(f"memfit monitor: off after an error of its own ({type(e).__name__}: {e}); training goes on",
                  file=sys.stderr)
        self.disabled = True
        self.close()


class _PhaseMark:
    """What mon.phase() returns: `with mon.phase("optimizer_step"):` ends the phase at the block's end."""
    __slots__ = ("mon",)

    def __init__(self, mon: MemoryMonitor):
        self.mon = mon

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> Literal[False]:
        self.mon.end_phase()
        return False
