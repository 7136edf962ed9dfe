"""What one sample of memory reads, without torch at import: the host (RSS, malloc) readers here and the
torch readers as functions that import torch when first called.

Every reader is cheap (a few microseconds: an ioctl-free /proc read or a libc call) because the monitor runs
every step; the bench (bench/monitor.py) measures the total."""
from __future__ import annotations

import ctypes
import os
import sys
import time

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# /proc/self/status is formatted field by field on each read (20-80 us right after a training step): the
# high-water mark since start only ever rises, so it is read again at most this often
HWM_EVERY_SECONDS = 0.2


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    """glibc's mallinfo2 (2.33+), or None: torch's CPU allocator takes tensor storage from malloc, so malloc's
    bytes in use are the live tensor bytes plus the (small) C heap, read in well under a microsecond. A scan
    of gc.get_objects() for tensors would see the same tensors but costs milliseconds in a big process."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


class HostReader:
    """Host memory of this process: malloc's bytes in use, the current RSS and the RSS high-water mark."""

    def __init__(self):
        self._malloc = _mallinfo2()
        self._statm = _open("/proc/self/statm")
        self._proc_status = _open("/proc/self/status")
        self._hwm: tuple[int | None, float] = (None, -1.0)  # (bytes, when read)
        self._psutil = None
        if self._statm is None:
            try:
                import psutil

                self._psutil = psutil.Process()
            except Exception:  # psutil missing or refused: resource's peak is the last resort
                self._psutil = None

    def malloc_in_use(self) -> int | None:
        if self._malloc is None:
            return None
        m = self._malloc()
        return int(m.uordblks + m.hblkhd)  # small chunks in use + chunks mmapped on their own (big tensors)

    def rss(self) -> int | None:
        # /proc/self/statm first: one pread of an fd kept open (~1 us); psutil opens and parses more per call
        if self._statm is not None:
            return int(os.pread(self._statm, 256, 0).split()[1]) * _PAGE
        if self._psutil is not None:
            return int(self._psutil.memory_info().rss)
        return self.peak_rss()  # no current RSS to read: the peak is the best there is

    def peak_rss(self, reset: bool = False) -> int | None:
        """The RSS high-water mark (VmHWM) of this process image: since it started (read again at most every
        HWM_EVERY_SECONDS), or with reset=True since the previous reset (writing 5 to /proc/self/clear_refs
        walks the page tables: ~0.1 ms a call for a few hundred MB resident, too dear by default). Not
        getrusage's ru_maxrss: exec keeps the launcher's, so a rank started from a big parent process would
        report the parent's peak."""
        if self._proc_status is None:
            import resource

            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        now = time.monotonic()
        if not reset and now - self._hwm[1] < HWM_EVERY_SECONDS:
            return self._hwm[0]
        data = os.pread(self._proc_status, 8192, 0)
        at = data.find(b"VmHWM:")
        peak = int(data[at + 6: data.index(b"kB", at)]) * 1024 if at >= 0 else None
        self._hwm = (peak, now)
        if reset:
            with open("/proc/self/clear_refs", "wb") as f:
                f.write(b"5")
        return peak

    def close(self) -> None:
        for fd in (self._statm, self._proc_status):
            if fd is not None:
                os.close(fd)
        self._statm = self._proc_status = None


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def distributed_rank() -> tuple[int, int]:
    """(rank, world size): torch.distributed's when a process group is up, else the launcher's RANK /
    WORLD_SIZE (torchrun, deepspeed, accelerate all set them), else (0, 1)."""
    torch = sys.modules.get("torch")  # never import torch just to ask: a run using it has imported it
    try:
        dist = torch.distributed if torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


def cuda_sample() -> dict:
    """The caching allocator's figures since the last call, then its peak reset so each step has its own."""
    import torch

    free, total = torch.cuda.mem_get_info()
    # the driver's used bytes: torch's reserved plus what torch does not count (CUDA context, NCCL buffers,
    # cuBLAS handles); with one process per GPU, as training runs, they are this process's (memfit calibrate)
    out = {"allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved(),
           "peak_allocated_bytes": torch.cuda.max_memory_allocated(), "device_used_bytes": int(total - free)}
    torch.cuda.reset_peak_memory_stats()
    return out


def cuda_total_bytes() -> int | None:
    """The device's total memory: NVML (what nvidia-smi shows) when pynvml is importable, matched by PCI bus so
    CUDA_VISIBLE_DEVICES renumbering cannot pick the wrong GPU; else the CUDA runtime's."""
    import torch

    device = torch.cuda.current_device()
    try:
        import pynvml

        pynvml.nvmlInit()
        p = torch.cuda.get_device_properties(device)
        bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"  # type: ignore[attr-defined]
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByPciBusId(bus)).total)
    except Exception:
        pass
    try:
        return int(torch.cuda.mem_get_info(device)[1])
    except Exception:
        return None
