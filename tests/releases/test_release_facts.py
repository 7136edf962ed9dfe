"""--framework-version: the estimate follows the release named (data/releases.toml), the default stays the pins."""
import json

import pytest

from memfit.errors import MemfitError
from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.releases import packages, release_range
from memfit.facts.scenario import Hardware
from memfit.facts.versions import pinned
from memfit.interfaces.cli.main import main
from memfit.roles.estimate import estimate

# Qwen2.5-7B: vocab 152064 (a 150k vocab); DPO micro-batch 1 at 2048 = 2 rows x 2048 tokens
DPO = dict(method="dpo", tuning="lora", seq_len=2048, micro_batch=1)


def _run(versions=None, profile="trl", gpu="a100-80gb", **knobs):
    hw = Hardware(gpu=find_gpu(gpu))
    return build_scenario(find_model("Qwen/Qwen2.5-7B"), hw, {**DPO, **knobs}, profile, versions=versions)


def _peak(s) -> int:
    return estimate(s).device_total.peak.total


def test_old_trl_dpo_holds_at_least_the_fp32_logits_more_than_the_pinned_release():
    s = _run({"trl": "0.8.6"})
    fp32_logits = 2 * 2048 * s.model.vocab_size * 4  # chosen + rejected rows x vocab, fp32
    assert s.model.vocab_size > 150_000
    assert _peak(s) - _peak(_run()) >= fp32_logits
    assert any("transformers 4.40.0 assumed with trl 0.8.6" in a for a in s.assumed)


def test_old_trl_logits_follow_the_transformers_release_that_returned_them():
    fp32 = _peak(_run({"trl": "0.11.4", "transformers": "4.44"}))  # the forward upcast the logits
    lowp = _peak(_run({"trl": "0.11.4", "transformers": "4.46"}))  # it stopped in 4.46
    assert fp32 - lowp >= 2 * 2048 * 152064 * 2  # at least one 16-bit copy's difference


def test_selective_log_softmax_releases_sit_between_the_old_and_the_fused_ones():
    old, mid, new = (_peak(_run(v)) for v in ({"trl": "0.14.0"}, {"trl": "1.5.0"}, None))
    assert old > mid > new


def test_no_version_and_the_pinned_version_estimate_the_same():
    pinned_run = _run({name: pinned()[name] for name in ("trl", "transformers", "deepspeed")})
    assert _peak(pinned_run) == _peak(_run())
    default = _run()
    assert default.releases == () and not any("framework releases" in a for a in default.assumed)


def test_transformers_4_defaults_are_applied_and_named_but_trl_keeps_its_non_reentrant_checkpointing():
    hf = _run({"transformers": "4.44"}, profile="hf-trainer", method="sft", checkpointing="full")
    assert hf.precision == "bf16-mixed" and hf.reentrant is True
    assert "reentrant=True (transformers 4.44 default)" in hf.assumed
    trl = _run({"transformers": "4.57"}, method="sft")
    assert trl.precision == "bf16-mixed" and trl.reentrant is False  # TRL forces use_reentrant=False


def test_a_knob_the_user_says_wins_over_the_release_default():
    assert _run({"transformers": "4.44"}, precision="bf16-pure").precision == "bf16-pure"


def test_the_trainer_fsdp_version_follows_the_transformers_release_and_moves_the_root():
    fsdp = dict(method="sft", tuning="full", engine="fsdp", micro_batch=1, seq_len=512)
    hw = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=8)

    def run(versions=None, **knobs):
        return build_scenario(find_model("meta-llama/Llama-3.1-8B"), hw, {**fsdp, **knobs}, "hf-trainer",
                              versions=versions)
    old, new, said = run({"transformers": "5.9.0"}), run({"transformers": "5.10.0"}), run(fsdp_version=1)
    assert (old.fsdp_version, new.fsdp_version, run().fsdp_version, said.fsdp_version) == (1, 2, 2, 1)
    assert "fsdp_version=1 (transformers 5.9.0 default)" in old.assumed
    # FSDP1 keeps its root unit (embedding, final norm, head) gathered while the loss runs; accelerate's FSDP2 only
    # the [final norm, head] unit, beside that unit's all-gather output
    from memfit.memory.inventory import base_tensors
    from memfit.memory.states import fsdp as fsdp_states

    embedding, head, norm = (128256 * 4096 * 2,) * 2 + (4096 * 2,)
    one, two = (fsdp_states.states(s, base_tensors(s.model)) for s in (old, new))
    assert one.gathered_loss == embedding + head + norm and one.forward_flat == 0
    assert two.gathered_loss == two.forward_flat == head + norm


def test_deepspeed_before_0_19_5_does_not_pin_offload_buffers():
    zero = dict(method="sft", zero_stage=2, offload_optimizer="cpu")
    old, new = _run({"deepspeed": "0.16.4"}, **zero), _run(**zero)
    assert (old.pin_memory, new.pin_memory) == (False, True)
    assert "pin_memory=False (deepspeed 0.16.4 default)" in old.assumed
    no_offload = _run({"deepspeed": "0.16.4"}, method="sft", zero_stage=2)
    assert not any("pin_memory" in a for a in no_offload.assumed)  # named only where it acts


@pytest.mark.parametrize("versions, words", [
    ({"trl": "1.12.0"}, "known ranges: [0.4.0, 0.12.0)"),  # the fused-head release is not known: refused
    ({"trl": "abc"}, "not a release number"),
    ({"transformers": "3.9"}, "known ranges"),
    ({"deepspeed": "0.8.3"}, "known ranges"),
    ({"frobnicate": "1.0"}, "memfit knows the releases of"),
    ({"trl": "0.13", "transformers": "4.40"}, "installs with transformers >= 4.46.0"),
])
def test_bad_versions_are_one_line_errors(versions, words):
    with pytest.raises(MemfitError) as e:
        _run(versions)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_every_range_is_ordered_and_read_somewhere():
    for name, package in packages().items():
        for r in package["range"]:
            assert release_range(name, r["from"]) is r
            assert r["read"]


def test_cli_old_trl_dpo_names_its_log_prob_kind_and_refuses_an_unknown_range(capsys):
    args = ["estimate", "Qwen/Qwen2.5-7B", "--gpu", "a100-80gb", "--profile", "trl", "--method", "dpo",
            "--tuning", "lora", "--seq", "2048", "--json"]
    assert main([*args, "--framework-version", "trl=0.8.6"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("'trl_log_softmax_fp32'" in a for a in doc["assumptions"])
    assert any("framework releases transformers 4.40.0, trl 0.8.6" in a for a in doc["assumptions"])
    assert main([*args, "--framework-version", "trl=1.12"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memfit: error: --framework-version trl=1.12") and "\n" not in err


def test_trace_refuses_other_releases_than_the_installed_ones(capsys):
    pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")
    code = main(["trace", "Qwen/Qwen2.5-0.5B", "--gpu", "a100-80gb", "--framework-version", "trl=0.11.4"])
    assert code == 2 and "drop --framework-version" in capsys.readouterr().err
