"""Build the DeepSpeed CPU ops the engine tests load, once, before pytest starts.

DeepSpeed compiles each op the first time a process asks for it (a JIT build into torch_extensions, 1-2 minutes
each on 2 cores), holding a lock the other pytest worker then waits on. Built here, the tests load them.
Prints one line per op; a build that fails names the op and leaves the tests to show the error.
"""
from __future__ import annotations

import sys
import time

OPS = ("CPUAdamBuilder", "ShareMemCommBuilder", "FusedAdamBuilder")  # DeepSpeedCPUAdam, the shm all-reduce, FusedAdam


def main() -> int:
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        print("deepspeed is not installed: no ops to build")
        return 0
    accelerator = get_accelerator()
    failed = 0
    for name in OPS:
        t = time.perf_counter()
        builder = accelerator.create_op_builder(name)
        try:
            builder.load(verbose=False)
        except Exception as e:  # the tests that load the op show the full error
            print(f"{name}: build failed ({type(e).__name__}: {str(e)[:200]})")
            failed += 1
            continue
        print(f"{builder.name}: ready in {time.perf_counter() - t:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
