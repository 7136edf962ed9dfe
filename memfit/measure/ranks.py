"""What the two-rank runners of a framework's own FSDP path share (memfit/measure/litgpt_ranks.py, accelerate_ranks.py,
verl_ranks.py):
FSDP1's flat parameters made visible to the tracker, the engine's objects claimed by category, and the launch of one
process per rank on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced(owner: object, name: str, value: object) -> Iterator[None]:
    """`owner.name` is `value` while the block runs, and what it was again after (a library's method patched for
    the length of one call)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def pinning_marked(tracker, on: bool) -> Iterator[None]:
    """CPUOffloadPolicy(pin_memory=True) on a CPU-only torch: `Tensor.pin_memory` needs an accelerator there. While
    an offload job runs it returns the tensor itself (what the host keeps is the same bytes) and the tracker marks
    it pinned."""
    import torch

    if not on or torch.cuda.is_available():
        yield
        return

    def pin_memory(tensor, *args, **kwargs):
        tracker.mark_pinned(tensor)
        return tensor

    with replaced(torch.Tensor, "pin_memory", pin_memory):
        yield


def patch_fsdp1(get_tracker) -> None:
    """FSDP1 frees and re-allocates the unsharded flat parameter with `storage.resize_` (torch.distributed.utils
    _alloc_storage / _free_storage), which the dispatcher does not see; re-read the size after each call."""
    import torch.distributed.fsdp._flat_param as flat
    import torch.distributed.utils as utils

    def wrap(fn):
        def resized(tensor, *args):
            fn(tensor, *args)
            tracker = get_tracker()
            if tracker is not None:
                tracker.refresh(tensor)
        return resized

    for name in ("_alloc_storage", "_free_storage"):
        setattr(flat, name, wrap(getattr(utils, name)))


def claim_states(tk, model, optimizer) -> None:
    """Claim the sharded params (FSDP1 flat shards behind the original params, FSDP2 DTensor shards), their
    gradients and AdamW's state."""
    for p in model.parameters():
        tk.claim(p if hasattr(p, "_local_tensor") else p.data, "weights", "device", "module.params")
        if p.grad is not None:
            tk.claim(p.grad, "gradients", "device", "param.grad")
    for m in model.modules():  # FSDP1: the flat parameters (their unsharded buffers too) and sharded gradients
        f = getattr(m, "_flat_param", None)
        if f is not None:
            tk.claim(f.data, "weights", "device", "fsdp1.flat_param")
            if getattr(f, "_full_param_padded", None) is not None:
                tk.claim(f._full_param_padded, "weights", "device", "fsdp1.unsharded_flat_param")
            if f.grad is not None:
                tk.claim(f.grad, "gradients", "device", "fsdp1.flat_grad")
    for b in model.buffers():
        tk.claim(b, "weights", "device", "module.buffers")
    for state in optimizer.state.values():
        for key, value in state.items():
            if hasattr(value, "untyped_storage") and key != "step":
                tk.claim(value, "optimizer_states", "device", f"optimizer.state.{key}")


def _free_port() -> int:
    """A port no other job on the machine holds (other measure runs may be rendezvousing at the same time)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_module(module: str, run: dict, timeout: int = 1200, world: int = 2) -> list[dict]:
    """The ranks of one run of `python -m MODULE --rank RUN OUT` as subprocesses of this one; their results, rank 0
    first."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            out = Path(tmp) / f"rank{rank}.json"
            procs.append((subprocess.Popen([sys.executable, "-m", module, "--rank",
                                            json.dumps(run), str(out)], env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True),
                          out))
        results = []
        for proc, out in procs:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode:
                raise RuntimeError(f"rank failed: {err.strip().splitlines()[-8:]}")
            results.append(json.loads(out.read_text()))
    return sorted(results, key=lambda r: r["rank"])


def runner_main(argv: list[str], module: str, run_rank, world_of=lambda run: 2) -> int:
    """A two-rank runner's command line: `--rank RUN OUT` runs one rank (run_rank(run) -> its JSON result, written to
    OUT); with no arguments each JSON run on stdin is launched on `world_of(run)` ranks of MODULE and its ranks'
    results printed as one JSON line."""
    if argv and argv[0] == "--rank":
        Path(argv[2]).write_text(json.dumps(run_rank(json.loads(argv[1]))))
        return 0
    for line in sys.stdin:
        if line.strip():
            run = json.loads(line)
            print(json.dumps({"run": run, "ranks": launch_module(module, run, world=world_of(run))}), flush=True)
    return 0
