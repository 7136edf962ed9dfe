"""One rank of a measure run: `python -m memfit.measure.worker JOBS.pkl OUTDIR`.

The launcher starts one process per rank with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set. Each
process initialises the process group once (gloo on the CPU, nccl on CUDA) and then runs every job in
the file in order, writing `OUTDIR/job{i}.rank{r}.json` per job (or `...error.json` on failure).
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import pickle
import shutil
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from memfit.breakdown import PHASES, Breakdown, PhaseProfile
from memfit.measure.patches import install_patches
from memfit.measure.ranks import pinning_marked
from memfit.measure.runners import runner_for
from memfit.measure.model import count_params
from memfit.measure.result import RankMeasurement
from memfit.measure.tracker import MemoryTracker, Step

_CURRENT: dict = {"tracker": None}
STEP_PHASES = ("forward", "backward", "optimizer_step")


class Rss:
    """Process RSS from /proc: current at named points, VmHWM (peak) within named phases."""

    def __init__(self):
        self.points: dict[str, int] = {}
        self.peaks: dict[str, int] = {}
        self._phase: str | None = None

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        return 0

    def point(self, name: str) -> None:
        self.points[name] = self._status("VmRSS:")

    def begin(self, phase: str) -> None:
        self.end()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak-RSS high-water mark to the current RSS
        except OSError:
            pass
        self._phase = phase

    def end(self) -> None:
        if self._phase is not None:
            self.peaks[self._phase] = max(self.peaks.get(self._phase, 0), self._status("VmHWM:"))
            self._phase = None


class CudaProbe:
    """On CUDA: torch's peak allocated / reserved per phase and NVML's device-used at the phase end.

    Written for GPU machines; a CPU run never creates one. allocated ~ the tracker's device total,
    reserved adds the caching allocator's cache, NVML adds CUDA context, NCCL and other non-torch memory.
    """

    def __init__(self, local_rank: int):
        self.device = torch.device("cuda", local_rank)
        self.phases: dict[str, dict[str, int]] = {}
        self._phase: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(local_rank)
        except Exception:  # noqa: BLE001 - NVML missing or broken: allocated/reserved still work
            self._nvml = None

    def begin(self, phase: str) -> None:
        self.end()
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._phase = phase

    def end(self) -> None:
        if self._phase is None:
            return
        torch.cuda.synchronize(self.device)
        row = self.phases.setdefault(self._phase, {"max_allocated": 0, "max_reserved": 0, "nvml_used": 0})
        row["max_allocated"] = max(row["max_allocated"], torch.cuda.max_memory_allocated(self.device))
        row["max_reserved"] = max(row["max_reserved"], torch.cuda.max_memory_reserved(self.device))
        if self._nvml is not None:
            row["nvml_used"] = max(row["nvml_used"], int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
        self._phase = None


class Probes:
    """RSS always; CUDA counters when there is a GPU. Same begin/end/point calls for both."""

    def __init__(self, cuda: CudaProbe | None):
        self.rss = Rss()
        self.cuda = cuda

    def begin(self, phase: str) -> None:
        self.rss.begin(phase)
        if self.cuda is not None:
            self.cuda.begin(phase)

    def end(self) -> None:
        self.rss.end()
        if self.cuda is not None:
            self.cuda.end()

    def point(self, name: str) -> None:
        self.rss.point(name)


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def make_batch(scenario, generator, device: str = "cpu") -> dict:
    """Synthetic full-length rows of the scenario's shape; labels = inputs (causal LM loss on every token)."""
    ids = torch.randint(0, scenario.model.vocab_size, (scenario.micro_batch, scenario.seq_len), generator=generator)
    ids = ids.to(device)
    return {"input_ids": ids, "labels": ids.clone()}


def _profile(tk: MemoryTracker, side: str, steps: int) -> PhaseProfile:
    steady = list(range(2, steps + 1)) or [1]
    phases = {}
    for phase in PHASES:
        if phase in STEP_PHASES:
            found = [tk.peaks.get((s, phase, side)) for s in steady]
        else:
            step = {"load": 0, "checkpoint_save": steps + 1, "resume": steps + 2}[phase]
            found = [tk.peaks.get((step, phase, side))]
        candidates = [c for c in found if c is not None]
        if candidates:
            best = max(candidates, key=lambda c: c.total)
            phases[phase] = Breakdown(dict(best.parts))
    return PhaseProfile(phases)


def _peak_sites(tk: MemoryTracker, steps: int, top: int = 12) -> dict[str, dict[str, list[dict]]]:
    """side -> phase -> the biggest allocation sites live at that phase's peak (category, site, bytes)."""
    out: dict[str, dict[str, list[dict]]] = {}
    steady = list(range(2, steps + 1)) or [1]
    for side in ("device", "host"):
        for phase in PHASES:
            keys = ([(s, phase, side) for s in steady] if phase in STEP_PHASES else
                    [({"load": 0, "checkpoint_save": steps + 1, "resume": steps + 2}[phase], phase, side)])
            snaps = [tk.peaks[k] for k in keys if k in tk.peaks]
            if not snaps or not max(s.total for s in snaps):
                continue
            best = max(snaps, key=lambda c: c.total)
            rows = sorted(best.sites.items(), key=lambda kv: -kv[1])[:top]
            out.setdefault(side, {})[phase] = [
                {"category": k.split("|", 1)[0], "site": k.split("|", 1)[1], "bytes": b} for k, b in rows]
    return out


def _step_peaks(tk: MemoryTracker) -> list[dict]:
    rows: dict[tuple[Step, str], dict[str, int | str]] = {}  # (step, phase) -> step, phase, bytes by side
    for (step, phase, side), snap in tk.peaks.items():
        rows.setdefault((step, phase), {"step": step, "phase": phase})[side] = snap.total
    return [rows[k] for k in sorted(rows)]


def run_job(job: dict, rank: int) -> tuple[RankMeasurement, tuple[int, int]]:
    scenario, steps, model_dir = job["scenario"], job["steps"], job.get("model_dir")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt_dir = Path(job["checkpoint_dir"])
    generator = torch.Generator().manual_seed(1234 + rank)
    tk = MemoryTracker()
    _CURRENT["tracker"] = tk
    rss = Probes(CudaProbe(int(os.environ.get("LOCAL_RANK", "0"))) if device == "cuda" else None)
    _trim()
    rss.point("baseline")
    # FSDP2's CPU offload pins its host shards; a CPU-only torch cannot pin
    with tk, pinning_marked(tk, scenario.engine == "fsdp" and scenario.fsdp_cpu_offload):
        # Warm-up build: not recorded. It teaches the tracker which engine allocation sites make which
        # objects, so the recorded "load" (the rebuild before resume, below) is labelled from birth.
        rss.begin("load")
        tk.record = False
        tk.set_phase("warmup", step=0)
        runner = runner_for(scenario, tk, model_dir, device)
        runner.build()
        runner.walk()
        params = count_params(runner.model)
        rss.end()
        rss.point("load")
        tk.record = True
        for step in range(1, steps + 1):
            for micro in range(scenario.grad_accum):
                boundary = micro == scenario.grad_accum - 1
                batch = make_batch(scenario, generator, device)
                rss.begin("forward")
                tk.set_phase("forward", step)
                loss = runner.forward(batch)
                rss.begin("backward")
                tk.set_phase("backward", step)
                runner.backward(loss)
                del loss, batch
                runner.walk()
                rss.begin("optimizer_step")
                tk.set_phase("optimizer_step", step)
                runner.step(boundary)
                runner.walk()
                rss.end()
        runner.check_trained()
        rss.point("steady")
        tk.reset_claims()
        runner.walk()
        buffers = tk.named_buffers()
        rss.begin("checkpoint_save")
        tk.set_phase("checkpoint_save", steps + 1)
        runner.save(ckpt_dir)
        runner.walk()
        rss.end()
        rss.point("checkpoint_save")
        runner.close()
        del runner
        _trim()
        leaked = dict(tk.side_total)
        tk.set_phase("load", 0)  # a fresh engine for the resume: this is the recorded load phase
        runner = runner_for(scenario, tk, model_dir, device)
        runner.build()
        runner.walk()
        rss.begin("resume")
        tk.set_phase("resume", steps + 2)
        runner.load(ckpt_dir)
        runner.walk()
        rss.end()
        rss.point("resume")
        runner.close()
        del runner
    _CURRENT["tracker"] = None
    measurement = RankMeasurement(
        rank=rank,
        device=_profile(tk, "device", steps),
        host=_profile(tk, "host", steps),
        rss_bytes=rss.rss.points,
        rss_peak_bytes=rss.rss.peaks,
        cuda=rss.cuda.phases if rss.cuda is not None else None,
        pinned_host_bytes=tk.pinned_peak,
        buffers=[],
        peak_sites=_peak_sites(tk, steps),
        step_peaks=_step_peaks(tk) + [{"step": "after_close", "phase": "leftover", **leaked}],
    )
    from memfit.measure.result import NamedBuffer

    measurement.buffers = [NamedBuffer(**b) for b in buffers]
    return measurement, params


def main(argv: list[str]) -> int:
    jobs_file, outdir = Path(argv[0]), Path(argv[1])
    jobs = pickle.loads(jobs_file.read_bytes())
    torch.set_num_threads(int(os.environ.get("MEMFIT_THREADS", "1")))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 or jobs[0]["scenario"].engine in ("deepspeed", "ddp", "fsdp"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl",
                                   verbose=False, timeout=timedelta(seconds=int(os.environ.get("MEMFIT_TIMEOUT", "600"))))
    install_patches(lambda: _CURRENT["tracker"])
    # zero.Init replaces torch.nn.functional.linear with zero3_linear_wrap and never restores it
    # (partition_parameters.py::_enable_mem_efficient_linear, "This will persist unless manually reset"):
    # every later job in this process would run its Linear layers through LinearFunctionForZeroStage3, which
    # under autocast saves the fp32 weight instead of caching its bf16 copy. Each job gets a fresh process's.
    linear = torch.nn.functional.linear
    for i, job in enumerate(jobs):
        started = time.time()
        name = f"job{i}.rank{rank}"
        try:
            measurement, params = run_job(job, rank)
            data = measurement.to_json() | {"wall_seconds": time.time() - started, "params": params}
            (outdir / f"{name}.json").write_text(json.dumps(data))
        except Exception as e:  # one failing job must not take the rest of the batch down
            (outdir / f"{name}.error.json").write_text(json.dumps({
                "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}))
            if dist.is_initialized():
                # a failure on one rank can leave the other blocked in a collective; stop the batch
                raise
        finally:
            torch.nn.functional.linear = linear
            if dist.is_initialized():
                dist.barrier()
            if rank == 0:
                shutil.rmtree(job["checkpoint_dir"], ignore_errors=True)
            _trim()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
