"""Message forms the corpus has no thread for, written as the library prints them (the source named per test),
and what `memfit doctor` says about bad input."""
import json

import pytest

from memfit.interfaces.cli.main import main
from memfit.interfaces.logs import parse_log

GiB, MiB, KiB = 2**30, 2**20, 2**10


def one(text: str):
    failures = parse_log(text).failures
    assert len(failures) == 1, failures
    return failures[0]


def test_pytorch_2_1_capacty_misspelling():
    # c10/cuda/CUDACachingAllocator.cpp in 2.1 printed "total capacty"
    f = one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty "
            "of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and "
            "2.30 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
            "PYTORCH_CUDA_ALLOC_CONF")
    assert (f.form, f.gpu, f.total_bytes, f.free_bytes) == ("pytorch-2.1", 0, 6 * GiB, 0)
    assert f.fragmentation  # 2.30 GiB unallocated >= 1.70 GiB asked
    assert f.other_processes_bytes is None  # no "this process" figure in this form


def test_private_pools_and_a_message_wrapped_by_the_terminal():
    # 2.2+ with CUDA graphs; the terminal cut "PyTorch" and a number in two
    f = one("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.12 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 2.11 GiB is free. Including non-PyTorch memory, this process has 76.96 "
            "GiB memory in use. Of the allocated memory 4\n[rank0]: 3.48 GiB is allocated by P\n[rank0]: yTorch, with "
            "241.21 MiB allocated in private pools (e.g., CUDA Graphs), and 30.59 GiB is reserved by PyTorch but "
            "unallocated.")
    assert f.rank == 0 and f.allocated_bytes == round(43.48 * GiB) and f.reserved_unallocated_bytes == round(30.59 * GiB)


def test_kib_units_and_the_1_0_cached_form():
    f = one("RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB total capacity; "
            "10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)")
    assert (f.tried_to_allocate_bytes, f.free_bytes, f.form) == (1024 * KiB, 576 * KiB, "pytorch-1.0-1.3")


def test_default_cpu_allocator_kernel_ray_and_nccl_cuda():
    f = one("RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate memory)")
    assert (f.kind, f.tried_to_allocate_bytes) == ("host_oom", 132426121216)
    f = one("[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, "
            "anon-rss:12918388kB, file-rss:68668kB, shmem-rss:53352kB, UID:1000 pgtables:49772kB oom_score_adj:0")
    assert (f.kind, f.form, f.allocated_bytes) == ("host_oom", "kernel-oom-killer", 12918388 * KiB)
    f = one("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\nMemory on the "
            "node (IP: 10.0.0.3, ID: 9b1c) where the task (actor ID: 5c8e, name=ActorModelRayActor.__init__, pid=8249,"
            " memory used=120.04GB) was running was 485.92GB / 503.74GB (0.964638), which exceeds the memory usage "
            "threshold of 0.95.")
    assert (f.allocated_bytes, f.total_bytes) == (485_920_000_000, 503_740_000_000)
    f = one("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled cuda error "
            "(run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclUnhandledCudaError: Call to CUDA "
            "function failed.\nLast error:\nCuda failure 2 'out of memory'")
    assert (f.kind, f.form) == ("nccl", "nccl-cuda")


def test_an_nccl_error_that_is_not_about_memory_is_not_a_memory_failure():
    assert parse_log("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:784, unhandled system error, NCCL version "
                     "2.7.8\nncclSystemError: socket timed out").failures == []


def test_a_launcher_exit_other_than_sigkill_is_not_a_host_oom():
    assert parse_log("[ERROR] [launch.py:321:sigkill_handler] ['python', 'x.py'] exits with return code = 1").failures \
        == []


@pytest.mark.parametrize("content", [b"", b"epoch 1 loss 0.3\nall good\n", bytes(range(256)) * 64])
def test_nothing_found_is_one_line_and_exit_2(tmp_path, capsys, content):
    log = tmp_path / "train.log"
    log.write_bytes(content)
    assert main(["doctor", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memfit: error: no memory failure found in {log}") and "memfit doctor reads" in err
    assert err.count("\n") == 1


def test_missing_log_is_one_line(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "nope.log")]) == 2
    assert "nope.log" in capsys.readouterr().err


def test_json_is_the_documented_schema(tmp_path, capsys):
    log = tmp_path / "err.txt"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 3 has a total "
                   "capacity of 31.74 GiB of which 1.41 GiB is free. Including non-PyTorch memory, this process has "
                   "30.26 GiB memory in use. Of the allocated memory 23.51 GiB is allocated by PyTorch, and 5.51 GiB "
                   "is reserved by PyTorch but unallocated.")
    assert main(["doctor", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"schema", "failures", "findings", "fixes"} and doc["schema"] == "memfit.doctor/1"
    assert set(doc["failures"][0]) == {"kind", "gpu", "tried_to_allocate_bytes", "total_bytes", "free_bytes",
                                       "allocated_bytes", "reserved_unallocated_bytes", "other_processes_bytes",
                                       "phase", "component", "fragmentation"}
    assert doc["failures"][0]["phase"] is None  # the log does not say
    assert doc["fixes"][0]["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
