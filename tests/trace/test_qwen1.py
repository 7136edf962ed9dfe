"""Qwen-1 (hub remote code modeling_qwen.py) traced on its own code: the shipped facts, the estimate against the
saved traces of bench/qwen1.json, and the re-derivation when the fetched file is here.

No network and no fetched file needed: the re-derivation is skipped (with the reason) unless modeling_qwen.py is at
MEMFIT_QWEN1_SOURCE (default /tmp/qwen1) and a transformers older than 5 (which the file needs) is at
MEMFIT_QWEN1_TRANSFORMERS (default /tmp/tf/4.44.2, made by pip install --no-deps --target).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.facts.remote_code import derived, remote_code

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import qwen1 as bench  # noqa: E402

TOLERANCE = 0.03


def test_facts_carry_their_source_and_versions():
    table = remote_code("qwen")
    src, traced = table["source"], table["traced"]
    assert src["repo"] and src["path"] == "modeling_qwen.py"
    assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and re.fullmatch(r"[0-9a-f]{40}", src["file_commit"])
    assert re.fullmatch(r"[0-9a-f]{64}", src["sha256"])
    assert traced["modeling_qwen_sha256"] == src["sha256"]  # derived from the file the source names
    for library in ("transformers", "torch", "peft"):
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", traced[library]), library
    assert derived("qwen")["checkpoint_reentrant"] in (True, False)
    for setup in ("autocast", "plain"):
        assert set(derived("qwen")[setup]) >= {"fused_qkv_kept", "mask_padded", "mask_causal", "shared_mask",
                                               "eager_scores", "eager_mask", "rotary_cache", "logits", "logits_one_row"}


def test_bench_traces_come_from_the_same_file():
    data = json.loads(bench.OUT.read_text())
    assert data["modeling_qwen_sha256"] == remote_code("qwen")["source"]["sha256"]
    assert data["source"]["commit"] == remote_code("qwen")["source"]["commit"]


@pytest.mark.parametrize("row", json.loads(bench.OUT.read_text())["rows"],
                         ids=lambda r: "-".join(f"{k}_{v}" for k, v in r["knobs"].items() if not k.startswith("lora_")))
def test_estimate_follows_qwen1_own_code(row):
    """Every phase's peak within 3% of the trace of modeling_qwen.py (CUDA context and allocator cache aside),
    checkpointed `_attn` rows too: a layer's backward moment is the larger of its MLP's and its attention's
    (memory/eager_attention.py), not their sum."""
    k = row["knobs"]
    est = bench.estimated(k)
    for phase, traced in row["phases"].items():
        assert -TOLERANCE * traced <= est[phase] - traced <= TOLERANCE * traced, (phase, est[phase], traced)


def test_only_qwen1_moves():
    """The facts apply to the family they were traced on: a transformers-native family is not touched."""
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware
    from memfit.memory.remote_code import adjusted

    s = build_scenario(find_model("Qwen/Qwen1.5-7B"), Hardware(gpu=find_gpu("a100-80gb")), {"seq_len": 1024})
    marker = object()
    assert adjusted(s, marker) is marker


@pytest.mark.parametrize("setup", ["autocast", "plain"])
def test_eager_scores_are_the_counts(setup):
    """memory/remote_code.py adds only what the transformers-shaped eager count lacks: it relies on that count
    keeping what the file's `_attn` keeps of the scores per head (the traced eager_scores; architectures.toml
    [qwen] eager_softmax_in_input_dtype makes it 16-bit without autocast)."""
    from memfit.memory.activations import attention_per_token

    s = bench.scenario(dict(bench.LORA, attention="eager", seq_len=1024, autocast=setup == "autocast"))
    _, per_key_saved, _ = attention_per_token(s, s.compute_bytes)
    assert per_key_saved == derived("qwen")[setup]["eager_scores"] * s.model.num_heads


def _rederivation_skip() -> str | None:
    source = Path(os.environ.get("MEMFIT_QWEN1_SOURCE", "/tmp/qwen1"))
    old = Path(os.environ.get("MEMFIT_QWEN1_TRANSFORMERS", "/tmp/tf/4.44.2"))
    if not (source / "modeling_qwen.py").is_file():
        return f"modeling_qwen.py is not at {source} (fetch it: data/remote_code.toml [qwen.source]); shipped facts used"
    if not (old / "transformers").is_dir():
        return f"no transformers < 5 at {old} (the file calls get_head_mask, gone in transformers 5)"
    return None


@pytest.mark.skipif(_rederivation_skip() is not None, reason=str(_rederivation_skip()))
def test_facts_rederive_from_the_file():
    env = dict(os.environ, PYTHONPATH=f"{os.environ.get('MEMFIT_QWEN1_TRANSFORMERS', '/tmp/tf/4.44.2')}:{ROOT}",
               MEMFIT_QWEN1_SOURCE=os.environ.get("MEMFIT_QWEN1_SOURCE", "/tmp/qwen1"))
    done = subprocess.run([sys.executable, "-m", "memfit.trace.qwen1_facts", "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_fsdp_takes_the_autocast_facts():
    """accelerate runs FSDP's forward under autocast (docs/knobs.md H.5), which memfit's FSDP engine leaves out; the
    file's 16-bit loss without autocast would lower the estimate, so FSDP takes the autocast facts, DeepSpeed not."""
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware
    from memfit.memory.remote_code import _setup

    hw = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=2)
    knobs = {"tuning": "lora", "precision": "bf16-mixed", "seq_len": 1024}
    fsdp = build_scenario(find_model("Qwen/Qwen-7B"), hw, {**knobs, "fsdp_strategy": "full_shard"})
    zero = build_scenario(find_model("Qwen/Qwen-7B"), hw, {**knobs, "zero_stage": 2})
    assert not fsdp.runs_autocast and not zero.runs_autocast
    assert _setup(fsdp) == derived("qwen")["autocast"] and _setup(zero) == derived("qwen")["plain"]
