"""Time the CPU optimizers an offloaded run uses, on this machine's CPU, for data/speed.toml [cpu_optimizer].

    python tools/measure_cpu_adam.py [--params 50_000_000] [--steps 5] [--threads N]

DeepSpeed's ZeRO-Offload steps DeepSpeedCPUAdam (deepspeed/ops/csrc/adam: an AVX-512 / AVX2 loop over the fp32
master weights, gradients and both moments, parallel over OpenMP threads); FSDP's CPU offload and torchtune step
torch.optim.AdamW on the CPU tensors. Each is timed on one flat fp32 tensor of `--params` parameters (a rank's
partition is a few large flat buffers, so per-tensor overhead does not matter), with as many threads as cores.

Prints one JSON object: the CPU model, cores, threads and versions, and for each implementation the median
parameters updated per second and per second per thread (the number speed.toml records; speed.py scales it by a
node's cores up to the node's memory bandwidth over the bytes each update moves).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _time_steps(step, steps: int) -> float:
    step()  # the first step allocates the moments (and builds nothing else)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _optimizers(params: int):
    """(name, factory) for each implementation; a factory returns a step function on fresh tensors."""
    import torch

    def fresh():
        p = torch.nn.Parameter(torch.randn(params, dtype=torch.float32))
        p.grad = torch.randn(params, dtype=torch.float32)
        return p

    def deepspeed_cpu_adam():
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        p = fresh()
        opt = DeepSpeedCPUAdam([p], lr=1e-5, adamw_mode=True)
        return opt.step

    def torch_adamw(**kw):
        def make():
            p = fresh()
            opt = torch.optim.AdamW([p], lr=1e-5, **kw)
            return opt.step
        return make

    return [("deepspeed_cpu_adam", deepspeed_cpu_adam),
            ("torch_adamw_single_tensor", torch_adamw(foreach=False)),
            ("torch_adamw_foreach", torch_adamw(foreach=True)),
            ("torch_adamw_fused", torch_adamw(fused=True))]


def measure(params: int, steps: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    results = {}
    for name, make in _optimizers(params):
        try:
            seconds = _time_steps(make(), steps)
        except Exception as e:  # an implementation this install cannot build or run: say why, keep the others
            results[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
            continue
        rate = params / seconds
        results[name] = {"step_seconds": round(seconds, 4), "params_per_second": round(rate),
                         "params_per_second_per_thread": round(rate / threads)}
    return results


def versions() -> dict:
    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import deepspeed

        out["deepspeed"] = deepspeed.__version__
    except ImportError:
        pass
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=int, default=50_000_000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))  # DeepSpeedCPUAdam's OpenMP loop
    doc = {"schema": "memfit.cpu_optimizer/1", "cpu_model": cpu_model(), "cores": os.cpu_count(),
           "threads": a.threads, "params": a.params, "steps": a.steps, "versions": versions(),
           "optimizers": measure(a.params, a.steps, a.threads)}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
