"""The tracker alone (no engine, one process): live bytes, labels, claims, peaks, and refusals."""
from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[measure])")

from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.measure.launch import plan  # noqa: E402
from memfit.measure.tracker import MemoryTracker  # noqa: E402
from memfit.facts.scenario import Hardware, Scenario  # noqa: E402

MB = 2**20


def test_live_bytes_follow_storages_not_views():
    tk = MemoryTracker()
    with tk:
        tk.set_phase("forward", 1)
        a = torch.empty(MB, dtype=torch.uint8)
        view = a[: MB // 2]  # a view: no new memory
        b = torch.empty(2 * MB, dtype=torch.uint8)
        assert tk.side_total["device"] == 3 * MB
        del a, b
        gc.collect()
        assert tk.side_total["device"] == MB  # the view keeps a's storage alive
        del view
        gc.collect()
        assert tk.side_total["device"] == 0
    assert tk.peaks[(1, "forward", "device")].total == 3 * MB
    assert tk.peaks[(1, "forward", "device")].parts == {"activations": 3 * MB}


def test_claims_move_bytes_between_sides_and_the_peak_follows():
    tk = MemoryTracker()
    with tk:
        tk.set_phase("optimizer_step", 2)
        master = torch.zeros(MB // 4, dtype=torch.float32)  # 1 MiB, a default guess: device engine buffer
        tk.claim(master, "optimizer_states", "host", "fp32 master")  # the engine says: offloaded
        tk.mark_pinned(master)
        assert tk.side_total == {"device": 0, "host": MB}
        assert tk.pinned_live == MB
        grad = torch.zeros(MB // 2, dtype=torch.bfloat16)
        tk.soft_claim(grad, "gradients", "device")
        tk.soft_claim(master, "gradients", "device")  # a claimed storage keeps its label
    snap_host = tk.peaks[(2, "optimizer_step", "host")]
    snap_device = tk.peaks[(2, "optimizer_step", "device")]
    assert snap_host.parts == {"optimizer_states": MB}
    assert snap_device.parts == {"gradients": MB}
    buffers = {b["name"]: b for b in tk.named_buffers()}
    assert buffers["fp32 master"]["storage_bytes"] == MB and buffers["fp32 master"]["pinned"]
    assert buffers["fp32 master"]["side"] == "host"


def test_build_context_is_host_and_logits_context_is_logits():
    tk = MemoryTracker()
    with tk:
        tk.set_phase("load", 0)
        tk.context = "build"
        w = torch.empty(MB, dtype=torch.uint8)
        tk.context = None
        tk.set_phase("forward", 1)
        tk.context = "logits"
        logits = torch.empty(MB, dtype=torch.uint8)
        tk.context = None
        assert tk.live[("host", "weights")] == MB
        assert tk.live[("device", "logits_loss")] == MB
        del w, logits


def _scenario(**changes) -> Scenario:
    s = Scenario(model=find_model("qwen2-0.5b-instruct"), hardware=Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=2),
                 engine="deepspeed", zero_stage=3)
    return s.with_changes(**changes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusals are for machines without CUDA")
def test_what_a_cpu_cannot_run_is_refused_in_one_line():
    cases = [({"tuning": "qlora"}, {}, "QLoRA needs bitsandbytes"),
             ({"optimizer": "paged-adamw-8bit"}, {}, "bitsandbytes, which needs CUDA"),
             ({"attention": "flash"}, {"allow_substitutions": False}, "flash-attention 2 needs CUDA")]
    for changes, kwargs, expected in cases:
        with pytest.raises(MemfitError, match=expected) as error:
            plan(_scenario(**changes), **kwargs)
        assert "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="substitutions are for machines without CUDA")
def test_flash_attention_runs_as_sdpa_and_says_so():
    adjusted, notes = plan(_scenario(attention="flash"))
    assert adjusted.attention == "sdpa"
    assert any("sdpa instead of flash" in n for n in notes)
    adjusted, notes = plan(_scenario(tuning="lora"))
    assert adjusted.adapter_dtype == "bf16"  # ZeRO-3 flattens one dtype per group


def test_gloo_reduce_scatter_scratch_is_not_device_memory():
    # ProcessGroupGloo::reduce_scatter_tensor_coalesced clones the whole input; NCCL has no such copy
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        tk = MemoryTracker()
        with tk:
            tk.set_phase("backward", 1)
            inp = torch.ones(MB, dtype=torch.float32)  # 4 MiB
            out = torch.empty(MB, dtype=torch.float32)
            dist.reduce_scatter_tensor(out, inp)
            assert tk.side_total["device"] == 8 * MB
        assert tk.peaks[(1, "backward", "device")].total == 8 * MB
    finally:
        dist.destroy_process_group()


def test_a_timeout_names_a_stale_op_build_lock(tmp_path, monkeypatch):
    # a DeepSpeed JIT build killed midway leaves `lock`; later builds wait on it forever (FileBaton)
    import os
    import time

    from memfit.measure.launch import _stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "py311_cpu" / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    assert _stale_build_locks() == ""  # a build in progress is not stale
    os.utime(lock, (time.time() - 3600, time.time() - 3600))
    assert str(lock) in _stale_build_locks()
