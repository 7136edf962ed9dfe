"""`memfit plan --max-seq / --max-batch`: the value found fits by the estimate's own verdict and one more does
not; caps and "none fits" say so; the command line works without --gpu (one row per catalog GPU)."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from memfit.facts.catalog import find_gpu
from memfit.interfaces.cli.main import main
from memfit.planner import limits
from memfit.planner.limits import largest, limit, limits_per_gpu, max_micro_batch, max_seq_len
from memfit.roles.generator import full_params
from memfit.roles.estimate import estimate

ZERO3_OFFLOAD = dict(model="qwen2-7b-instruct", gpu="rtx4090", gpus=4, profile="openrlhf", tuning="full",
                     zero_stage=3, offload_optimizer="cpu", micro_batch=4, seq_len=128, checkpointing="full",
                     attention="flash")
LORA_24GB = dict(model="llama-3.1-8b", gpu="rtx4090", tuning="lora", micro_batch=1, checkpointing="full",
                 attention="flash")
DPO = dict(model="llama-3.1-8b", gpu="a100-80gb", gpus=8, profile="openrlhf", method="dpo", tuning="full",
           zero_stage=3, checkpointing="full", attention="flash")
PPO = dict(model="llama-3.1-8b", gpu="a100-80gb", gpus=8, profile="openrlhf", method="ppo", tuning="full",
           zero_stage=3, checkpointing="full", attention="flash", vllm_gpu_memory_utilization=0.5)
RUNS = {"zero3-offload": ZERO3_OFFLOAD, "lora-24gb": LORA_24GB, "dpo": DPO, "ppo": PPO}
LIMIT_CLI = [sys.executable, "-m", "memfit.interfaces.cli.main", "plan", "meta-llama/Llama-3.1-8B", "--tuning", "lora",
             "--micro-batch", "1", "--ckpt", "--attn", "flash"]


def verdict(s, **knob) -> str:
    return estimate(replace(s, **knob)).verdict


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("knob", ["seq_len", "micro_batch"])
def test_found_value_fits_and_one_more_does_not(scenario, run, knob):
    s = scenario(**RUNS[run])
    found = limit(s, knob)
    assert found.value is not None and found.stop in ("gpu_memory", "host_ram", "vllm_kv_cache")
    assert verdict(s, **{knob: found.value}) == "fits"
    assert found.next.value == found.value + 1 and not found.next.fits
    if found.stop != "vllm_kv_cache":  # otherwise the estimate may say fits while vLLM cannot hold the sequence
        assert verdict(s, **{knob: found.value + 1}) != "fits"
    at = estimate(replace(s, **{knob: found.value}))
    assert found.at.device_peak_bytes == at.device_total.peak.total and found.at.margin_bytes == at.margin_bytes


def test_named_helpers_search_their_knob(scenario):
    s = scenario(**LORA_24GB)
    assert max_seq_len(s).value == limit(s, "seq_len").value > 1000
    assert max_micro_batch(s.with_changes(seq_len=512)).knob == "micro_batch"


@pytest.mark.parametrize("run", ["lora-24gb", "dpo"])
def test_memory_grows_with_sequence_and_batch(scenario, run):
    """The search assumes it: once a value does not fit, no larger one does, and the peak never falls."""
    s = scenario(**RUNS[run])
    for knob, values in (("seq_len", range(256, 40000, 997)), ("micro_batch", range(1, 40, 3))):
        probes = [limits.probe(s, knob, v) for v in values]
        peaks = [p.device_peak_bytes for p in probes]
        assert peaks == sorted(peaks)
        fitting = [p.fits for p in probes]
        assert fitting == sorted(fitting, reverse=True) and True in fitting and False in fitting


@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 7, 64, 65, 1000, 4095, 4096])
@pytest.mark.parametrize("hint", [1, 5, 64, 5000])
def test_largest_finds_the_threshold_from_any_hint(threshold, hint):
    calls = []

    def fits(v):
        calls.append(v)
        return v <= threshold

    value, miss = largest(fits, hint, cap=4096)
    assert value == (threshold or None)
    assert miss == (None if threshold == 4096 else threshold + 1)
    assert len(calls) <= 2 * 13 + 2  # doubling then bisection: logarithmic


def test_a_vllm_without_room_for_one_sequence_stops_ppo(scenario):
    """The estimate may still say fits; the run cannot start (the planner's rule: no step time)."""
    from memfit.planner.step_time import step_time

    s = scenario(**(PPO | {"vllm_gpu_memory_utilization": 0.25}))
    found = max_seq_len(s)
    assert found.stop == "vllm_kv_cache" and verdict(s, seq_len=found.value + 1) == "fits"
    assert step_time(replace(s, seq_len=found.value)).tokens_per_second > 0
    assert step_time(replace(s, seq_len=found.value + 1)).tokens_per_second == 0
    ppo = scenario(**PPO)
    share = full_params(ppo.model) * 2 / ppo.vllm_tp / 2 / ppo.hardware.gpu.memory_bytes  # half vLLM's bf16 weights
    nothing = max_seq_len(replace(ppo, vllm_gpu_memory_utilization=share))  # the weights overfill vLLM's share
    assert (nothing.value, nothing.cause) == (None, "vllm_kv_cache")


def test_the_model_position_limit_caps_the_sequence(scenario):
    s = scenario(**LORA_24GB)
    short = replace(s, model=replace(s.model, max_position_embeddings=1024))
    found = max_seq_len(short)
    assert (found.value, found.stop, found.next) == (1024, "position_limit", None)
    assert verdict(short, seq_len=1024) == "fits" and verdict(short, seq_len=1025) == "fits"  # memory is not the limit


def test_catalog_position_limit(scenario):
    found = max_seq_len(scenario(model="bigcode/gpt_bigcode-santacoder", gpu="h100", attention="flash"))
    assert (found.value, found.stop, found.cap) == (2048, "position_limit", 2048)


def test_search_cap_is_said(scenario, monkeypatch):
    monkeypatch.setitem(limits.SEARCH_CAP, "micro_batch", 4)
    found = max_micro_batch(scenario(**LORA_24GB, seq_len=64))
    assert (found.value, found.stop, found.cap) == (4, "search_cap", 4)
    assert found.to_json()["stop"] == "search_cap"


def test_none_fits_reports_the_verdict_and_peak_at_one(scenario):
    s = scenario(model="qwen2-7b-instruct", gpu="rtx4090", tuning="full", attention="flash")  # 7B x 16 bytes
    found = max_seq_len(s)
    assert (found.value, found.stop, found.cause) == (None, "none_fits", "gpu_memory")
    at_one = estimate(replace(s, seq_len=1))
    assert found.at.verdict == at_one.verdict == "oom"
    assert found.at.device_peak_bytes == at_one.device_total.peak.total > s.hardware.gpu.memory_bytes


def test_host_ram_can_be_what_stops_it(scenario):
    found = max_micro_batch(scenario(**ZERO3_OFFLOAD, host_ram=64 * 10**9))
    assert (found.value, found.cause, found.at.verdict) == (None, "host_ram", "host_oom")


def test_fits_follows_the_estimate_verdict_rule(scenario, monkeypatch):
    """A wider error band in the estimate's rule shortens the limit with no change here."""
    import memfit.roles.estimate as estimate_module

    s = scenario(**LORA_24GB)
    before = max_seq_len(s).value
    real = estimate_module.band_of

    def wider(run):
        b = real(run)
        return replace(b, fraction=1.5 * b.fraction, real_fraction=1.5 * b.real_fraction, floor=b.floor + 2**30)

    monkeypatch.setattr(estimate_module, "band_of", wider)
    after = max_seq_len(s)
    assert after.value < before
    assert verdict(s, seq_len=after.value) == "fits" and verdict(s, seq_len=after.value + 1) == "tight"


def test_every_catalog_gpu_gets_a_row(scenario):
    s = scenario(**LORA_24GB)
    cards = tuple(find_gpu(g) for g in ("t4", "rtx4090", "a100-80gb", "h100"))
    rows = limits_per_gpu(s, "seq_len", cards)
    assert [r.gpu.id for r in rows] == ["t4", "rtx4090", "h100", "a100-80gb"]  # smallest memory first
    assert rows[0].stop == "refused" and "flash" in rows[0].at.message  # flash attention needs Ampere
    assert rows[1].value == max_seq_len(s).value < rows[2].value
    for r in rows[1:]:
        assert verdict(limits.on_gpu(s, r.gpu), seq_len=r.value) == "fits"


def test_cli_without_gpu_lists_the_catalog_as_json():
    out = subprocess.run(LIMIT_CLI + ["--max-seq", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "memfit.limits/1" and doc["knob"] == "seq_len" and not doc["gpu_given"]
    found = {r["gpu"]: r for r in doc["rows"]}
    assert len(found) >= 10 and {"rtx4090", "h100", "t4"} <= set(found)
    assert found["t4"]["stop"] == "refused"
    assert 0 < found["rtx4090"]["value"] < found["h100"]["value"]
    assert found["rtx4090"]["verdict"] == "fits" and found["rtx4090"]["next_verdict"] in ("tight", "oom")
    assert doc["fixed"]["micro_batch"] == 1 and "seq_len" not in doc["fixed"]


def test_cli_table_with_a_gpu(capsys):
    assert main(["plan", "llama-3.1-8b", "--gpu", "rtx4090", "--tuning", "lora", "--ckpt", "--attn", "flash",
                 "--seq", "1024", "--max-batch"]) == 0
    out = capsys.readouterr().out
    assert "largest micro-batch" in out and "max batch" in out and "GPU memory" in out and "rtx4090" in out


def test_max_seq_and_max_batch_together_is_one_line_exit_2():
    out = subprocess.run(LIMIT_CLI + ["--max-seq", "--max-batch"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "not allowed with" in out.stderr


@pytest.mark.parametrize("extra", [["--allow", "lora"], ["--global-batch", "8"]])
def test_plan_search_flags_with_a_limit_are_refused(capsys, extra):
    assert main(["plan", "llama-3.1-8b", "--tuning", "lora", "--max-seq", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--max-seq" in err


def test_plan_without_a_limit_still_needs_a_gpu(capsys):
    assert main(["plan", "llama-3.1-8b", "--tuning", "lora"]) == 2
    assert "say which GPU" in capsys.readouterr().err
