"""`--profile litgpt` on 2 devices against LitGPT's own several-device strategies run for real on 2 gloo ranks
(bench/litgpt_distributed.py; its measurements are kept in bench/litgpt_distributed.json, so only the re-run needs
LitGPT's venv)."""
import importlib.util
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("litgpt_distributed_bench", ROOT / "bench" / "litgpt_distributed.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)

TOLERANCE_PCT = 5.0
VENV = Path(os.environ.get("MEMFIT_LITGPT_VENV") or ROOT / ".venvs" / "litgpt")
SEVERAL = tomllib.loads((ROOT / "memfit" / "facts" / "data" / "frameworks" / "litgpt.toml").read_text())[
    "model_code"]["several_devices"]


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads(bench.MEASURED.read_text())


@pytest.mark.parametrize("index", range(len(bench.ROWS)))
def test_estimate_is_within_5_percent_of_the_measured_row(saved, index):
    row = bench.ROWS[index]
    (_, est, got, err), = bench.compare([row], saved["rows"])
    assert abs(err) <= TOLERANCE_PCT, f"{bench.label(row)}: estimate {est:,} vs measured {got:,} ({err:+.1f}%)"


def test_the_rows_were_measured_on_the_release_the_facts_cite(saved):
    assert saved["versions"]["litgpt"] == SEVERAL["litgpt"]
    assert saved["versions"]["lightning"] == SEVERAL["lightning"]
    assert set(saved["rows"]) == {bench._key(r) for r in bench.ROWS}, "python bench/litgpt_distributed.py --remeasure"


def _row(saved, method: str, shape: str = "wide", precision: str = "bf16-true") -> dict:
    return next(m for k, m in saved["rows"].items() if json.loads(k)["method"] == method
                and json.loads(k)["shape"] == shape and json.loads(k).get("precision", "bf16-true") == precision)


def test_fsdp1_keeps_a_gradient_for_every_parameter_of_a_unit_that_trains(saved):
    """What `flat_params` says: under FSDPStrategy (use_orig_params=True) LLaMA-Adapter v2, whose every Block and root
    hold a trainable parameter, ends backward with the whole model's sharded gradient (2 B x all / 2 ranks); v1 with the
    gradient of its prompted Blocks only; LoRA under FSDP2 with its adapters' only."""
    assert bench.TUNING["adapter_v2"] in SEVERAL["flat_params"] and "lora" not in SEVERAL["flat_params"]
    v2 = _row(saved, "adapter_v2")
    step_grads = max(r["phases"]["optimizer_step"]["gradients"] for r in v2["ranks"])
    assert step_grads >= 2 * v2["ranks"][0]["params"] // 2 * 0.99
    lora = _row(saved, "lora")
    assert max(r["phases"]["optimizer_step"]["gradients"] for r in lora["ranks"]) <= 2 * lora["ranks"][0]["trainable"]


def test_the_root_stays_gathered_through_backward(saved):
    """What `root_gathered` says: LoRA's backward peak (FSDP2, reshard_after_forward unset) holds the shards, the root
    (wte, ln_f, lm_head) and two Blocks unsharded, in bf16."""
    c = bench.SHAPES["wide"]
    root = 2 * (2 * c["padded_vocab_size"] * c["n_embd"] + c["n_embd"])
    lora = _row(saved, "lora")["ranks"][0]
    gathered = lora["phases"]["backward"]["weights"] + lora["phases"]["backward"].get("engine_buffers", 0)
    shards = lora["phases"]["optimizer_step"]["weights"]
    assert gathered - shards >= root


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="LitGPT's venv (tests/trace/setup_litgpt_venv.sh)")
@pytest.mark.parametrize("row", [{"method": "adapter_v2", "shape": "wide", "micro_batch": 1, "seq_len": 512},
                                 {"method": "lora", "shape": "wide", "micro_batch": 1, "seq_len": 512,
                                  "precision": "bf16-mixed"}], ids=["fsdp1-bf16-true", "fsdp2-bf16-mixed"])
def test_a_fresh_two_rank_run_matches_the_estimate(row):
    """A row run again on 2 gloo ranks (about half a minute each): LLaMA-Adapter v2 under FSDP1, the row the flat
    gradients and the root kept gathered decide; LoRA under FSDP2 in bf16-mixed, fp32 gathers under CUDA's autocast
    lists (the runner's CPU stand-in for Fabric's CUDA autocast)."""
    (result,) = bench.run_rows([row])
    (_, est, got, err), = bench.compare([row], {bench._key(row): bench._kept(result)})
    assert abs(err) <= TOLERANCE_PCT, f"estimate {est:,} vs measured {got:,} ({err:+.1f}%)"


def test_accuracy_reports_the_group():
    """bench/accuracy.py's framework groups carry these rows (bench/framework_paths.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import framework_paths

    group = framework_paths.framework_groups()["framework:litgpt-distributed"]
    assert group["rows"] == len(bench.ROWS) and group["max_abs_pct_error"] <= TOLERANCE_PCT, group
    assert group["versions"]["litgpt"] == SEVERAL["litgpt"]


MIXED = SEVERAL["mixed"]


def test_bf16_mixed_shards_fp32_and_lora_gathers_fp32(saved):
    """What [model_code.several_devices.mixed] says, in the measured rows: under bf16-mixed every shard is fp32 (the
    model built in fp32), FSDP1 gathers bf16 (MixedPrecision param_dtype) and lora.py's FSDP2 the fp32 params (the
    root's 2 x V x H + H elements at 4 B beside the shards at its backward peak; FSDP1 the root and two layers at
    2 B)."""
    assert MIXED["model_dtype"] == "fp32" and MIXED["fsdp2_param_dtype"] == "fp32"
    for method in ("lora", "full", "adapter_v2", "adapter"):
        rank = _row(saved, method, precision="bf16-mixed")["ranks"][0]
        assert rank["phases"]["optimizer_step"]["weights"] >= 4 * rank["params"] // 2
    c = bench.SHAPES["wide"]
    root = 2 * c["padded_vocab_size"] * c["n_embd"] + c["n_embd"]
    lora = _row(saved, "lora", precision="bf16-mixed")["ranks"][0]
    backward = lora["phases"]["backward"]
    shards = lora["phases"]["optimizer_step"]["weights"]
    assert backward["weights"] + backward.get("engine_buffers", 0) - shards >= 4 * root
    v2 = _row(saved, "adapter_v2", precision="bf16-mixed")["ranks"][0]  # the root and two layers, at 2 B
    layer = (v2["params"] - root) // c["n_layer"]
    gathered = v2["phases"]["backward"]["weights"] - v2["phases"]["optimizer_step"]["weights"]
    assert gathered <= 2 * (root + 2 * layer) * 1.01


_FABRIC_MIXED = """
import inspect, json
from importlib.metadata import version
import torch
from lightning.fabric.connector import _Connector
from lightning.fabric.plugins.precision.amp import MixedPrecision
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
from litgpt.finetune.lora import parallelize_fn
name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
fsdp, amp = FSDPPrecision("bf16-mixed"), MixedPrecision("bf16-mixed", device="cuda")
mp = fsdp.mixed_precision_config
with fsdp.module_init_context():
    fsdp_init = name[torch.get_default_dtype()]
with amp.module_init_context():
    amp_init = name[torch.get_default_dtype()]
print(json.dumps({"lightning": version("lightning"), "litgpt": version("litgpt"),
    "fsdp1_mixed_precision": {k: name[getattr(mp, k)] for k in ("param_dtype", "reduce_dtype", "buffer_dtype")},
    "fsdp_forward": [fsdp.forward_context().device, name[fsdp.forward_context().fast_dtype]], "fsdp_init": fsdp_init,
    "amp_forward": [amp.forward_context().device, name[amp.forward_context().fast_dtype]], "amp_init": amp_init,
    "connector_amp": "MixedPrecision(precision=self._precision_input, device=device)"
                     in inspect.getsource(_Connector._check_and_init_precision),
    "parallelize_mp_policy": "mp_policy" in inspect.getsource(parallelize_fn)}))
"""


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="LitGPT's venv (tests/trace/setup_litgpt_venv.sh)")
def test_fabric_bf16_mixed_is_what_the_facts_say():
    """Fails when Lightning's bf16-mixed changes: FSDPPrecision's MixedPrecision config for FSDP1, the dtype both
    plugins build the model in, their CUDA autocast forward, and lora.py's fully_shard without an mp_policy."""
    import subprocess

    done = subprocess.run([str(VENV / "bin" / "python"), "-c", _FABRIC_MIXED], capture_output=True, text=True,
                          check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert (got["lightning"], got["litgpt"]) == (SEVERAL["lightning"], SEVERAL["litgpt"])
    assert got["fsdp1_mixed_precision"] == MIXED["fsdp1_mixed_precision"]
    assert got["fsdp_init"] == got["amp_init"] == MIXED["model_dtype"]
    assert MIXED["forward_autocast"] and got["fsdp_forward"] == got["amp_forward"] == ["cuda", "bf16"]
    assert got["connector_amp"]  # ModelParallelStrategy's plugin: the connector's MixedPrecision (autocast)
    assert not got["parallelize_mp_policy"] and MIXED["fsdp2_param_dtype"] == MIXED["model_dtype"]
