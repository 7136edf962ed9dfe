"""Start one process per rank, run the jobs, collect each rank's JSON into a MeasureResult.

Processes, not threads: every rank gets its own RSS, its own allocator and its own DeepSpeed state, as
in a real launch. A batch of scenarios with the same world size shares one set of processes (imports
and process-group setup cost ~10 s per launch on 2 cores), which is how the bench stays fast.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.engines import engine_of
from memfit.facts.knobs import acting_when
from memfit.facts.methods import OPENRLHF_DPO_METHODS, several_models
from memfit.measure.result import MeasureResult, RankMeasurement
from memfit.facts.scenario import Scenario
from memfit.facts.versions import installed

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_CPU_RANKS = 8


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        raise MemfitError("memfit measure needs torch (pip install torch transformers peft deepspeed)") from None
    return torch.cuda.is_available()


def plan(scenario: Scenario, allow_substitutions: bool = True) -> tuple[Scenario, list[str]]:
    """The scenario as it will run on this machine, and what was changed to run it.

    Raises MemfitError (one line) for what cannot be measured here at all.
    """
    cuda = _cuda()
    used_instead: list[str] = []
    if several_models(scenario.method) and (scenario.method not in OPENRLHF_DPO_METHODS
                                            or scenario.engine != "deepspeed"):
        raise MemfitError(f"measure runs {scenario.method} only as OpenRLHF's DPO/IPO on DeepSpeed "
                          f"(--method dpo --engine deepspeed --profile openrlhf)")
    if scenario.tuning == "qlora" and not cuda:
        raise MemfitError("QLoRA needs bitsandbytes 4-bit kernels, which need CUDA; measure a LoRA run (--tuning lora) on the CPU instead")
    if scenario.optimizer in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit") and not cuda:
        raise MemfitError(f"optimizer {scenario.optimizer} is bitsandbytes, which needs CUDA; measure with --optimizer adamw-fused on the CPU")
    if scenario.optimizer == "adafactor":
        raise MemfitError("memfit measure runs AdamW or SGD; adafactor is not wired into the measure runners")
    if scenario.loss != "standard":
        raise MemfitError(f"loss {scenario.loss!r} is not wired into measure; it runs the transformers loss (--loss standard)")
    if "nvme" in (engine_of(scenario).optimizer_offload(scenario), engine_of(scenario).param_offload(scenario)):
        raise MemfitError("NVMe offload needs an NVMe path and async I/O; measure runs offload to cpu (--offload-optimizer cpu)")
    if scenario.fsdp_strategy in ("hybrid_shard", "no_shard"):
        raise MemfitError(f"FSDP2 measure runs full_shard or shard_grad_op; {scenario.fsdp_strategy} is not wired")
    if scenario.engine == "fsdp" and scenario.fsdp_version == 1:
        raise MemfitError("memfit measure runs FSDP2 (fully_shard); measure with --fsdp-version 2 (FSDP1 as the HF "
                          "Trainer runs it is measured by memfit.measure.accelerate_ranks, bench/accelerate_fsdp.py)")
    if not cuda and scenario.world_size > MAX_CPU_RANKS:
        raise MemfitError(f"{scenario.world_size} ranks on the CPU is too many; measure runs up to {MAX_CPU_RANKS} CPU ranks")
    if not cuda and scenario.precision.startswith("fp16"):
        raise MemfitError("fp16 mixed precision needs CUDA (CPU fp16 kernels are incomplete); measure with --precision bf16-mixed")
    if scenario.checkpointing in ("offload", "unsloth") and not cuda:
        raise MemfitError(f"--ckpt {scenario.checkpointing} moves saved activations to the host with .to('cpu'), "
                          "which is a no-op on a CPU run; measure it on CUDA, or use --ckpt full here")
    attention = scenario.attention
    if scenario.attention == "flash" and not cuda:
        if not allow_substitutions:
            raise MemfitError("flash-attention 2 needs CUDA; rerun with --attn sdpa (measure on the CPU uses sdpa)")
        attention = "sdpa"
        used_instead.append("attention sdpa instead of flash-attention 2 (no CUDA): activations differ from a flash run")
    compute = scenario.precision.split("-")[0]
    if (scenario.zero_stage == 3 and scenario.tuning == "lora"
            and scenario.adapter_dtype != compute and compute != "fp32"):
        # stage3 defragment() asserts one dtype per param group; LLaMA-Factory keeps adapters in the
        # compute dtype under ZeRO-3 for this reason (src/llamafactory/model/adapter.py::init_adapter)
        scenario = scenario.with_changes(adapter_dtype=compute)
        used_instead.append(f"LoRA adapters in {compute} (ZeRO-3 flattens one dtype per group; fp32 adapters assert)")
    if scenario.padding != "padded":
        used_instead.append(f"full-length synthetic rows (padding {scenario.padding!r} has no effect without real data)")
    if not cuda:
        used_instead.append("CPU + gloo: tensors split into device/host by the engine's own objects, not by tensor.device")
    if attention != scenario.attention:
        scenario = scenario.with_changes(attention=attention)
    return scenario, used_instead


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_engine(s: Scenario) -> str:
    return engine_of(s).describe(s)


def run_batch(scenarios: list[Scenario], steps: int = 3, model_dir: str | None = None, *, timeout: float = 1800,
              allow_substitutions: bool = True, threads: int = 1, keep_dir: str | None = None) -> list[MeasureResult]:
    """Measure several scenarios with one set of rank processes (all must have the same world size)."""
    if not scenarios:
        return []
    world = scenarios[0].world_size
    if any(s.world_size != world for s in scenarios):
        raise MemfitError("a measure batch needs one world size; split the scenarios by --gpus")
    if steps < 1:
        raise MemfitError("--steps must be at least 1 (3 recommended: step 1 creates optimizer state lazily)")
    plans = [plan(s, allow_substitutions) for s in scenarios]
    workdir = Path(keep_dir or tempfile.mkdtemp(prefix="memfit-measure-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for old in list(workdir.glob("job*.json")) + list(workdir.glob("rank*.log")):
        old.unlink()
    jobs = [{"scenario": adjusted, "steps": steps, "model_dir": model_dir, "checkpoint_dir": str(workdir / f"ckpt{i}")}
            for i, (adjusted, _) in enumerate(plans)]
    (workdir / "jobs.pkl").write_bytes(pickle.dumps(jobs))
    started = time.time()
    _launch(world, workdir, timeout, threads)
    results = []
    for i, (s, (_, used_instead)) in enumerate(zip(scenarios, plans)):
        results.append(_collect(i, s, world, steps, used_instead, workdir))  # raises with the logs kept
    for r in results:
        r.wall_seconds = r.wall_seconds or (time.time() - started) / len(results)
    if keep_dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def run_measure(scenario: Scenario, steps: int = 3, model_dir: str | None = None, **kwargs) -> MeasureResult:
    """N real steps of the scenario's engine, a checkpoint save and a resume; memory by category per rank."""
    return run_batch([scenario], steps, model_dir, **kwargs)[0]


def _stale_build_locks(older_than_s: float = 600) -> str:
    """A DeepSpeed op JIT build killed midway leaves its torch_extensions `lock` file behind, and every later
    build of that op waits on it forever (torch.utils.file_baton.FileBaton): name any old one."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    old = [str(f) for f in root.glob("**/lock") if time.time() - f.stat().st_mtime > older_than_s]
    return f"; a killed op build left {', '.join(old)}: remove it and run again" if old else ""


def _launch(world: int, workdir: Path, timeout: float, threads: int) -> None:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   LOCAL_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(threads), MEMFIT_THREADS=str(threads),
                   # freed tensors go back to the OS at once, so RSS follows live tensors
                   MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536",
                   PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
        log = open(workdir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed in the finally below
        procs.append((subprocess.Popen([sys.executable, "-m", "memfit.measure.worker", str(workdir / "jobs.pkl"),
                                        str(workdir)], env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p, _ in procs):
            if time.time() > deadline:
                raise MemfitError(f"measure ranks did not finish within {timeout:.0f} s (logs in {workdir})"
                                  + _stale_build_locks())
            if any(p.poll() not in (None, 0) for p, _ in procs):
                time.sleep(5)  # give the other ranks a moment to write their error, then stop them
                break
            time.sleep(0.2)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
        _remove_shm_buffers(port)


def _remove_shm_buffers(port: int) -> None:
    """DeepSpeed's CPU all-reduce (csrc/cpu/comm/shm.cpp) maps one /dev/shm file per rank, named after the
    master address and port, and never unlinks it: ~66 MiB of RAM per rank per run would stay behind."""
    for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
        f.unlink(missing_ok=True)


def _collect(i: int, s: Scenario, world: int, steps: int, used_instead: list[str], workdir: Path) -> MeasureResult:
    ranks, params, wall = [], (0, 0), 0.0
    for rank in range(world):
        ok, err = workdir / f"job{i}.rank{rank}.json", workdir / f"job{i}.rank{rank}.error.json"
        if err.exists():
            raise MemfitError(f"measure failed on rank {rank}: {json.loads(err.read_text())['error']} (logs in {workdir})")
        if not ok.exists():
            tail = (workdir / f"rank{rank}.log").read_text()[-2000:].strip().splitlines()
            last = tail[-1] if tail else "no output"
            raise MemfitError(f"measure rank {rank} produced no result: {last} (logs in {workdir})")
        data = json.loads(ok.read_text())
        params = tuple(data.get("params", params))
        wall = max(wall, data.get("wall_seconds", 0.0))
        ranks.append(RankMeasurement.from_json(data))
    return MeasureResult(
        engine=describe_engine(s), world_size=world, device_kind="cuda" if _cuda() else "cpu", steps=steps,
        ranks=ranks, used_instead=used_instead, params_total=params[0], params_trainable=params[1],
        wall_seconds=wall, versions=installed(), scenario=_scenario_summary(s))


def _scenario_summary(s: Scenario) -> dict:
    out = {"model": s.model.id, "tuning": s.tuning, "precision": s.precision, "optimizer": s.optimizer,
           "engine": s.engine, "micro_batch": s.micro_batch, "seq_len": s.seq_len, "grad_accum": s.grad_accum,
           "checkpointing": s.checkpointing, "attention": s.attention, "world_size": s.world_size}
    if s.engine == "deepspeed":
        out["deepspeed"] = {k: getattr(s, k) for k in acting_when("deepspeed")}
    if s.uses_adapters:
        out["lora"] = {"rank": s.lora_rank, "targets": list(s.lora_targets)}
    return out
