"""Memory failures in a training log: every form PyTorch has printed its CUDA OOM in (1.0's "cached", 1.4-2.0's
"(GPU 0; X total capacity; ...)", 2.1's "total capacty" misspelling, 2.2+'s "Process N has ... memory in use",
private pools, and a missing GPU index), host-side deaths (DefaultCPUAllocator, the DeepSpeed launcher's and
torchrun's SIGKILL, the kernel's OOM killer, Ray's memory monitor, a shell's "Killed"), NCCL failures that are
memory failures, and DeepSpeed's see_memory_usage lines as a timeline.

Only reads text: it never raises on what a log contains (binary, truncated, interleaved ranks)."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from memfit.errors import MemfitError
from memfit.interfaces.logs.sites import (
    Frame,
    site_of_frames,
    site_of_markers,
    thresholds,
    units,
)

SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB)"
FACTOR = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
WRAP_LINES = 6  # a terminal wraps one OOM message over a few lines: read that many as one
NEAR_LINES = 15  # an NCCL error's reason ("Cuda failure 'out of memory'") sits within this many lines
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# a rank's or a Ray actor's prefix on every line it prints
PREFIX = re.compile(r"^(?:[\w.-]+:\s+)?\[rank(?P<rank>\d+)\]:\s?|^\((?P<actor>[\w.]+) pid=\d+(?:, ip=[\d.]+)?\)\s")

CUDA_OOM = re.compile(r"(?:CUDA|HIP|XPU)\s*out\s*of\s*memory\.")
TRIED = re.compile(r"Tried\s*to\s*allocate\s*" + SIZE)
OLD_FORM = re.compile(  # PyTorch 1.0 - 2.0
    r"\(GPU\s*(?P<gpu>\d*)\s*;\s*(?P<total>" + SIZE + r")\s*total\s*capacity;\s*(?P<alloc>" + SIZE
    + r")\s*already\s*allocated;\s*(?P<free>" + SIZE + r")\s*free;\s*(?:" + SIZE + r"\s*allowed;\s*)?"
    r"(?:(?P<reserved>" + SIZE + r")\s*reserved\s*in\s*total\s*by\s*PyTorch|(?P<cached>" + SIZE + r")\s*cached)")
NEW_FORM = re.compile(  # PyTorch 2.1+ ("capacty" in 2.1), GPU index missing in some builds
    r"GPU\s*(?P<gpu>\d*)\s*has\s*a\s*total\s*capac(?:i)?ty\s*of\s*(?P<total>" + SIZE + r")\s*of\s*which\s*(?P<free>"
    + SIZE + r")\s*is\s*free")
PROCESS = re.compile(r"Process\s*(\d+)\s*has\s*" + SIZE + r"\s*memory\s*in\s*use")
THIS_PROCESS = re.compile(r"this\s*process\s*has\s*" + SIZE + r"\s*memory\s*in\s*use")
OF_ALLOCATED = re.compile(
    r"Of\s*the\s*allocated\s*memory\s*(?P<alloc>" + SIZE + r")\s*is\s*allocated\s*by\s*PyTorch,\s*(?:with\s*"
    + SIZE + r"\s*allocated\s*in\s*private\s*pools\s*\([^)]*\),\s*)?and\s*(?P<unalloc>" + SIZE
    + r")\s*is\s*reserved\s*by\s*PyTorch\s*but\s*unallocated")
CUDA_ERROR_OOM = re.compile(r"CUDA error: out of memory|cuda runtime error \(2\) : out of memory|"
                            r"CUBLAS_STATUS_ALLOC_FAILED")
CPU_ALLOC = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate "
                       r"(?P<n>\d+)\s*(?P<unit>bytes|GB)")
SIGKILL = re.compile(r"exits with return code = -9\b|failed \(exitcode: -9\)|Signal 9 \(SIGKILL\) received by PID|"
                     r"terminated with signal SIGKILL|^\s*(?:.*\])?Killed\s*$")
KERNEL_KILL = re.compile(r"Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)(?: total-vm:(?P<vm>\d+)kB, "
                         r"anon-rss:(?P<rss>\d+)kB)?")
KERNEL_OOM_KILL = re.compile(r"oom-kill:constraint=\w+.*?task=(?P<name>[^,]+),pid=(?P<pid>\d+)")
KERNEL_TABLE = re.compile(r"\[\s*(?P<pid>\d+)\]\s+\d+\s+\d+\s+(?P<vm>\d+)\s+(?P<rss>\d+)\s+\d+\s+\d+\s+-?\d+\s+\S+\s*$")
RAY_KILL = re.compile(r"Task was killed due to the node running low on memory|"
                      r"(?:task|actor) was killed due to the node running low on memory")
RAY_NODE = re.compile(r"Memory on the node .*? was (?P<used>[\d.]+)GB / (?P<total>[\d.]+)GB")
NCCL_ERROR = re.compile(r"NCCL error|ncclUnhandledCudaError|ncclSystemError|NCCL WARN Cuda failure")
NCCL_GPU_OOM = re.compile(r"Cuda failure (?:\d+ )?'out of memory'")
NCCL_SHM = re.compile(r"Error while creating shared memory segment|No space left on device")
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
FRAME_PY = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
FRAME_IPY = re.compile(r"File (?P<file>\S+?\.py):\d+, in (?:[\w.]+\.)?(?P<func>\w+)\(")
TRACE_BODY = re.compile(r"\s+\S|\s*\[Previous line repeated")  # a frame's source line, carets
DS_LABEL = re.compile(r"see_memory_usage\]\s*(?P<label>.*?)\s*$")
DS_GPU = re.compile(r"MA ([\d.]+) GB\s+Max_MA ([\d.]+) GB\s+CA ([\d.]+) GB\s+Max_CA ([\d.]+) GB")
DS_CPU = re.compile(r"CPU Virtual Memory:\s*used = ([\d.]+) GB, percent = ([\d.]+)%")


@dataclass
class Failure:
    """One memory failure; None where the log does not say. Bytes are integers."""

    kind: str  # cuda_oom | host_oom | nccl
    gpu: int | None = None
    tried_to_allocate_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None  # by PyTorch on the GPU; a killed process's resident memory on the host
    reserved_unallocated_bytes: int | None = None
    other_processes_bytes: int | None = None
    phase: str | None = None
    component: str | None = None
    fragmentation: bool = False
    # not in the JSON failure record: how it was found
    form: str = ""  # which message form (e.g. "pytorch-2.2+", "deepspeed-launcher")
    line: int = 0  # 1-based line of the log
    rank: int | None = None
    this_process_bytes: int | None = None

    def to_json(self) -> dict:
        keys = ("kind", "gpu", "tried_to_allocate_bytes", "total_bytes", "free_bytes", "allocated_bytes",
                "reserved_unallocated_bytes", "other_processes_bytes", "phase", "component", "fragmentation")
        return {k: getattr(self, k) for k in keys}


@dataclass
class TimelinePoint:
    """One DeepSpeed see_memory_usage report (GiB as DeepSpeed prints them, read back into bytes)."""

    label: str
    line: int
    allocated_bytes: int | None = None  # MA
    max_allocated_bytes: int | None = None  # Max_MA
    reserved_bytes: int | None = None  # CA
    max_reserved_bytes: int | None = None  # Max_CA (DeepSpeed rounds it to whole GB)
    host_used_bytes: int | None = None
    host_percent: float | None = None


@dataclass
class LogReport:
    failures: list[Failure] = field(default_factory=list)
    timeline: list[TimelinePoint] = field(default_factory=list)
    lines: int = 0


def read_log(path: str) -> str:
    """The log as text: `-` is stdin; undecodable bytes become U+FFFD, NULs are dropped."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        p = Path(path)
        if p.is_dir():
            raise MemfitError(f"{path}: is a folder; give the log file (or - for stdin)")
        data = p.read_bytes()
    return data.decode("utf-8", errors="replace").replace("\x00", "")


def size(number: str, unit: str) -> int:
    return round(float(number) * FACTOR[unit])


def _size_at(m: re.Match, group: str) -> int | None:
    """The bytes of a SIZE captured as `group`, None where the match left that group out."""
    if m.group(group) is None:
        return None
    return _size_of(m, group)


def _size_of(m: re.Match, group: str) -> int:
    """The bytes of a SIZE captured as `group` in a match that has it (a group the pattern requires, or one the
    caller saw matched)."""
    start = m.re.groupindex[group]  # SIZE's number and unit are the two groups inside it
    return size(m.group(start + 1), m.group(start + 2))


def clean(line: str) -> tuple[str, int | None]:
    """A line without colour codes and without a rank's or Ray actor's prefix, and that rank."""
    line = ANSI.sub("", line).rstrip("\r\n")
    m = PREFIX.match(line)
    if not m:
        return line, None
    return line[m.end():], int(m.group("rank")) if m.group("rank") else None


def parse_log(text: str) -> LogReport:
    cleaned = [clean(x) for x in text.splitlines()]
    lines = [c[0] for c in cleaned]
    report = LogReport(lines=len(lines))
    previous = 0  # a traceback or marker before the previous failure belongs to that one
    for i in range(len(lines)):
        found = _cuda_oom(lines, i) or _cuda_error(lines, i) or _host(lines, i) or _nccl(lines, i)
        if found:
            found.line, found.rank = i + 1, cleaned[i][1]
            _place(found, lines, i, previous)
            report.failures.append(found)
            previous = i
    report.failures = _merge_host(_dedupe(report.failures))
    report.timeline = _timeline(lines)
    return report


# ---------------------------------------------------------------- device

def _cuda_oom(lines: list[str], i: int) -> Failure | None:
    m = CUDA_OOM.search(lines[i])
    if not m:
        return None
    window = _window(lines, i, m.start())
    f = Failure("cuda_oom", form="pytorch")
    tried = TRIED.search(window)
    if tried:
        f.tried_to_allocate_bytes = size(tried.group(1), tried.group(2))
    old, new = OLD_FORM.search(window), NEW_FORM.search(window)
    if old:
        _old_form(f, old)
    elif new:
        _new_form(f, new, window)
    _fragmentation(f)
    return f


def _window(lines: list[str], i: int, start: int) -> str:
    """The message from `start` on, over the next lines a terminal may have wrapped it to, up to the next
    OOM message. Joined without a separator: a wrap cuts words and numbers anywhere."""
    text = lines[i][start:]
    for j in range(i + 1, min(i + WRAP_LINES, len(lines))):
        if CUDA_OOM.search(lines[j]) or TRACEBACK.search(lines[j]):
            break
        text += lines[j]
    head = CUDA_OOM.search(text)
    nxt = CUDA_OOM.search(text, head.end()) if head else None
    return text[: nxt.start()] if nxt else text


def _old_form(f: Failure, m: re.Match) -> None:
    f.gpu = int(m.group("gpu")) if m.group("gpu") else None
    total, free, allocated = (_size_of(m, g) for g in ("total", "free", "alloc"))  # the pattern requires all three
    f.total_bytes, f.free_bytes, f.allocated_bytes = total, free, allocated
    if m.group("reserved"):
        reserved = _size_of(m, "reserved")
        f.reserved_unallocated_bytes = max(reserved - allocated, 0)
        f.form = "pytorch-1.4-2.0"
    else:  # 1.0-1.3 printed the cache's free blocks as "cached" (the pattern's other alternative)
        cached = _size_of(m, "cached")
        reserved = allocated + cached
        f.reserved_unallocated_bytes = cached
        f.form = "pytorch-1.0-1.3"
    # no "this process" figure: its CUDA context is counted with the others (thresholds allow for it)
    f.other_processes_bytes = max(total - free - reserved, 0)


def _new_form(f: Failure, m: re.Match, window: str) -> None:
    f.gpu = int(m.group("gpu")) if m.group("gpu") else None
    total, free = _size_of(m, "total"), _size_of(m, "free")  # the pattern requires both
    f.total_bytes, f.free_bytes = total, free
    f.form = "pytorch-2.1" if "capacty" in m.group(0) else "pytorch-2.2+"
    alloc = OF_ALLOCATED.search(window)
    if alloc:
        f.allocated_bytes, f.reserved_unallocated_bytes = _size_of(alloc, "alloc"), _size_of(alloc, "unalloc")
    this = THIS_PROCESS.search(window)
    procs = [size(n, u) for _, n, u in PROCESS.findall(window)]
    if this:
        f.this_process_bytes = size(this.group(1), this.group(2))
    elif procs:
        f.this_process_bytes = _this_among(procs, (f.allocated_bytes or 0) + (f.reserved_unallocated_bytes or 0))
    if f.this_process_bytes is not None:
        f.other_processes_bytes = max(total - free - f.this_process_bytes, 0)


def _this_among(procs: list[int], pytorch: int) -> int:
    """Which "Process N has X" line is this process: NVML lists every process on the GPU and the message does
    not say which is its own; ours holds at least what PyTorch reserved, so the smallest that does."""
    holding = [p for p in procs if p >= pytorch]
    return min(holding) if holding else max(procs)


def _fragmentation(f: Failure) -> None:
    t = thresholds()
    unalloc, tried = f.reserved_unallocated_bytes, f.tried_to_allocate_bytes
    f.fragmentation = bool(unalloc is not None and tried and unalloc >= t["fragmentation_min_bytes"]
                           and unalloc >= t["fragmentation_min_share_of_request"] * tried)


def _cuda_error(lines: list[str], i: int) -> Failure | None:
    if not CUDA_ERROR_OOM.search(lines[i]):
        return None
    return Failure("cuda_oom", form="cuda-error")  # cudaMalloc's own error: no figures


# ---------------------------------------------------------------- host

def _host(lines: list[str], i: int) -> Failure | None:
    line = lines[i]
    m = CPU_ALLOC.search(line)
    if m:
        n = int(m.group("n")) * (2**30 if m.group("unit") == "GB" else 1)  # 2019's message said "%dGB"
        return Failure("host_oom", tried_to_allocate_bytes=n, form="default-cpu-allocator")
    m = KERNEL_KILL.search(line) or KERNEL_OOM_KILL.search(line)
    if m:
        return _kernel(m, lines, i)
    if RAY_KILL.search(line):
        return _ray(lines, i)
    if SIGKILL.search(line):
        return Failure("host_oom", form="sigkill")
    return None


def _kernel(m: re.Match, lines: list[str], i: int) -> Failure:
    u = units()
    f = Failure("host_oom", form="kernel-oom-killer")
    if m.groupdict().get("rss"):
        f.allocated_bytes = int(m.group("rss")) * u["kernel_kb"]
        return f
    pid = m.group("pid")  # the process table printed before the kill line has its resident pages
    for line in lines[max(0, i - 400): i]:
        row = KERNEL_TABLE.search(line)
        if row and row.group("pid") == pid:
            f.allocated_bytes = int(row.group("rss")) * u["kernel_page"]
    return f


def _ray(lines: list[str], i: int) -> Failure:
    f = Failure("host_oom", form="ray-memory-monitor")
    for line in lines[i: i + NEAR_LINES]:
        m = RAY_NODE.search(line)
        if m:
            gb = units()["ray_gb"]
            f.allocated_bytes, f.total_bytes = int(float(m.group("used")) * gb), int(float(m.group("total")) * gb)
            break
    return f


def _merge_host(failures: list[Failure]) -> list[Failure]:
    """The lines of one host death (the kernel's kill, the launcher's -9, torchrun's SIGKILL) as one failure,
    with every figure any of them gives."""
    host = [f for f in failures if f.kind == "host_oom"]
    if len(host) < 2:
        return failures
    merged = host[0]
    for other in host[1:]:
        for fld in fields(Failure):
            if getattr(merged, fld.name) in (None, "") and getattr(other, fld.name) not in (None, ""):
                setattr(merged, fld.name, getattr(other, fld.name))
    return [f for f in failures if f.kind != "host_oom" or f is merged]


# ---------------------------------------------------------------- NCCL

def _nccl(lines: list[str], i: int) -> Failure | None:
    if not NCCL_ERROR.search(lines[i]):
        return None
    near = lines[max(0, i - NEAR_LINES): i + NEAR_LINES]
    if any(NCCL_GPU_OOM.search(x) for x in near):
        return Failure("nccl", component="NCCL buffers on the GPU (cudaMalloc failed)", form="nccl-cuda")
    if any(NCCL_SHM.search(x) for x in near):
        return Failure("nccl", component="NCCL shared-memory segment in /dev/shm (host)", form="nccl-shm")
    return None  # an NCCL error that is not a memory failure (timeouts, mismatched collectives)


# ---------------------------------------------------------------- where

def _place(f: Failure, lines: list[str], i: int, since: int) -> None:
    """Phase and component from the traceback that ends at line i, else from the log lines before it (after the
    previous failure's line `since`, whose traceback is its own)."""
    phase, component = site_of_frames(_frames_before(lines, i, since))
    if phase is None and component is None:
        phase, component = site_of_markers(lines[max(since, i - 400): i])
    f.phase = f.phase or phase
    f.component = f.component or component


def _frames_before(lines: list[str], i: int, since: int) -> list[Frame]:
    start = next((j for j in range(i, max(since, i - 2000) - 1, -1) if TRACEBACK.search(lines[j])), None)
    if start is None:
        start = _pasted_tail(lines, i, since)
    out = []
    for line in lines[start: i + 1]:
        m = FRAME_PY.search(line) or FRAME_IPY.search(line)
        if m:
            out.append(Frame(m.group("file"), m.group("func").split(".")[-1]))
    return out


def _pasted_tail(lines: list[str], i: int, since: int) -> int:
    """Where the frames directly above line i begin when the log has no "Traceback" header: a pasted error is
    often only its last frames. Only the unbroken run of frame and source lines counts, so an older traceback
    further up is not read as this one's."""
    j = i
    while j - 1 >= since and (FRAME_PY.search(lines[j - 1]) or FRAME_IPY.search(lines[j - 1])
                             or TRACE_BODY.match(lines[j - 1])):
        j -= 1
    return j


def _dedupe(failures: list[Failure]) -> list[Failure]:
    """One failure per distinct figures: every rank, and the exception's repeat in the traceback, print it."""
    seen, out = set(), []
    for f in failures:
        key = (f.kind, f.gpu, f.tried_to_allocate_bytes, f.total_bytes, f.free_bytes, f.allocated_bytes,
               f.reserved_unallocated_bytes, f.phase, f.component)
        if f.kind == "cuda_oom" and f.form == "cuda-error" and any(g.kind == "cuda_oom" and g.form != "cuda-error"
                                                                     for g in failures):
            continue  # the same OOM said twice: keep the form with figures
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


# ---------------------------------------------------------------- timeline

def _timeline(lines: list[str]) -> list[TimelinePoint]:
    gb = units()["deepspeed_gb"]
    points: list[TimelinePoint] = []
    for i, line in enumerate(lines):
        gpu, cpu = DS_GPU.search(line), DS_CPU.search(line)
        if (gpu or cpu) and (not points or (points[-1].allocated_bytes if gpu else points[-1].host_used_bytes)
                             is not None):
            points.append(TimelinePoint("", i + 1))  # a report whose label line the log does not have
        if gpu:
            ma, max_ma, ca, max_ca = (int(float(x) * gb) for x in gpu.groups())
            points[-1] = replace(points[-1], allocated_bytes=ma, max_allocated_bytes=max_ma, reserved_bytes=ca,
                                 max_reserved_bytes=max_ca)
        elif cpu:
            points[-1] = replace(points[-1], host_used_bytes=int(float(cpu.group(1)) * gb),
                                 host_percent=float(cpu.group(2)))
        elif not gpu and not cpu:
            label = DS_LABEL.search(line)
            if label:
                points.append(TimelinePoint(label.group("label"), i + 1))
    return [p for p in points if p.allocated_bytes is not None or p.host_used_bytes is not None]
