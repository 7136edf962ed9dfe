"""Read memfit.monitor/1 lines (written by memfit.monitor.MemoryMonitor), from files that may still grow.

A file is read from where the last read stopped; a last line without its newline is a run still writing it
and waits for the next read. Any other bad line is the user's input: one MemfitError naming file and line."""
from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass

from memfit.breakdown import PHASES
from memfit.errors import MemfitError

SCHEMA = "memfit.monitor/1"
_INTS = ("rank", "step")
_NUMBERS = ("time", "step_seconds", "tokens", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes",
            "host_peak_rss_bytes", "device_total_bytes", "host_rss_bytes", "world_size", "device_used_bytes")


@dataclass
class Sample:
    rank: int
    step: int
    tokens: int | None
    step_seconds: float | None
    device_kind: str | None
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    host_peak_rss: int | None
    device_total: int | None
    host_rss: int | None
    device_used: int | None = None  # CUDA: the driver's used bytes (torch's reserved + context, NCCL)
    phase_peaks: dict[str, int] | None = None  # the peak of each phase the run marked (CUDA: allocated)

    @property
    def peak(self) -> int | None:
        """The step's peak: the allocator's on CUDA, the RSS high-water mark on the CPU, else what was held."""
        for v in (self.peak_allocated, self.host_peak_rss, self.allocated):
            if v is not None:
                return v
        return None


def expand(path: str) -> list[str]:
    """A path as given, or the per-rank files a multi-rank run wrote for it (NAME.rank{N}.jsonl)."""
    if os.path.exists(path):
        return [path]
    stem = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    ranks = sorted(glob.glob(glob.escape(stem) + ".rank*.jsonl"))
    if not ranks:
        raise MemfitError(f"{path}: no such file (nor per-rank files {stem}.rank*.jsonl)")
    return ranks


class RunReader:
    """Every sample of the given files, by rank and step (a step seen again, as after a restart, replaces the
    earlier one)."""

    def __init__(self, paths: list[str]):
        self.files = [f for p in paths for f in expand(p)]
        self._offset = {f: 0 for f in self.files}
        self._line_no = {f: 0 for f in self.files}
        self.ranks: dict[int, dict[int, Sample]] = {}

    def poll(self) -> int:
        """Read what the files gained since the last poll; returns how many samples came."""
        return sum(self._read(f) for f in self.files)

    def _read(self, path: str) -> int:
        with open(path, "rb") as fh:
            fh.seek(self._offset[path])
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]  # a partial last line: the run is writing it
        self._offset[path] += len(complete)
        count = 0
        for raw in complete.splitlines():
            self._line_no[path] += 1
            if raw.strip():
                s = parse_line(raw, f"{path}:{self._line_no[path]}")
                self.ranks.setdefault(s.rank, {})[s.step] = s
                count += 1
        return count

    def by_rank(self) -> dict[int, list[Sample]]:
        return {r: [steps[k] for k in sorted(steps)] for r, steps in sorted(self.ranks.items())}


def parse_line(raw: bytes, where: str) -> Sample:
    try:
        d = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError as e:
        raise MemfitError(f"{where}: not a JSON line ({e}); memfit watch reads the memfit.monitor/1 lines "
                          f"memfit.monitor.MemoryMonitor writes") from None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        got = d.get("schema") if isinstance(d, dict) else type(d).__name__
        raise MemfitError(f"{where}: schema {got!r}, expected {SCHEMA!r} (a line of memfit.monitor.MemoryMonitor)")
    for k in _INTS:
        if not _is_int(d.get(k)) or d[k] < 0:
            raise MemfitError(f"{where}: {k} must be a whole number >= 0, got {d.get(k)!r}")
    for k in _NUMBERS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            raise MemfitError(f"{where}: {k} must be a number >= 0 or null, got {v!r}")
    return Sample(rank=d["rank"], step=d["step"], tokens=_int(d.get("tokens")), step_seconds=d.get("step_seconds"),
                  device_kind=d.get("device_kind") if isinstance(d.get("device_kind"), str) else None,
                  allocated=_int(d.get("allocated_bytes")), reserved=_int(d.get("reserved_bytes")),
                  peak_allocated=_int(d.get("peak_allocated_bytes")), host_peak_rss=_int(d.get("host_peak_rss_bytes")),
                  device_total=_int(d.get("device_total_bytes")), host_rss=_int(d.get("host_rss_bytes")),
                  device_used=_int(d.get("device_used_bytes")), phase_peaks=_phase_peaks(d.get("phase_peaks"), where))


def _phase_peaks(v, where: str) -> dict[str, int] | None:
    """Optional (lines of runs that marked no phase have none): memfit's phase names to bytes."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise MemfitError(f"{where}: phase_peaks must be an object of phase -> bytes, got {v!r}")
    for name, peak in v.items():
        if name not in PHASES:
            raise MemfitError(f"{where}: phase_peaks has unknown phase {name!r} (memfit's phases: {', '.join(PHASES)})")
        if not _is_int(peak) or peak < 0:
            raise MemfitError(f"{where}: phase_peaks[{name!r}] must be a whole number of bytes >= 0, got {peak!r}")
    return dict(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v) -> int | None:
    return None if v is None else int(v)
