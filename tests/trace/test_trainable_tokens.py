"""PEFT trainable tokens (TrainableTokensConfig, and LoRA's trainable_token_indices): the facts come from PEFT's own
TrainableTokensLayer (memfit/trace/token_facts.py), and the estimate agrees with the trace of the real model."""
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from memfit.facts.adapters import layer_facts  # noqa: E402
from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402
from memfit.trace import token_facts  # noqa: E402

COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")


def _scenario(model: str, tuning: str = "trainable_tokens", profile: str = "hf-trainer", **knobs):
    given = {"tuning": tuning, "trainable_tokens": 64, "micro_batch": 1, "seq_len": 512} | knobs
    return build_scenario(find_model(model), Hardware(find_gpu("a100-80gb")), given, profile)


def _peak(profile) -> int:
    return max(sum(b.get(c) for c in COMPARED) for b in profile.phases.values())


def test_a_tied_head_keeps_a_merged_copy_of_the_whole_embedding():
    """PEFT builds the full V x H weight with the trained rows each forward; the tied head's F.linear keeps it."""
    for sizes in token_facts.SIZES:
        f = token_facts.held_facts(False, torch.bfloat16, torch.float32, sizes)
        assert ("V*H", 2) in f["head_saved"] and ("V*H", 2) not in f["embedding_saved"]
        assert f["trainable"] == [("H*N", 4)] and f["frozen"] == [("H*N", 2)]
    assert layer_facts()["trainable_tokens"]["fp32"]["embedding_backward"] == [["V*H", 4]]


@pytest.mark.parametrize("model, tuning, knobs", [
    ("qwen2.5-0.5b", "trainable_tokens", {}),  # tied: the head's merged copy lives with the logits
    ("qwen2.5-0.5b", "trainable_tokens", dict(profile="peft-loop", adapter_dtype="bf16", checkpointing="full",
                                              seq_len=64)),
    # untied, short rows: the embedding's own merged weight (forward) and its gradient (backward) are the peak
    ("phi-3-mini", "trainable_tokens", dict(profile="peft-loop", adapter_dtype="bf16", checkpointing="full",
                                            seq_len=64)),
    ("qwen2.5-0.5b", "lora", dict(lora_rank=16)),  # LoraConfig trainable_token_indices beside the adapters
], ids=["qwen-tied-autocast", "qwen-tied-bf16-ckpt-short", "phi3-untied-short", "qwen-lora-with-tokens"])
def test_estimate_within_3_percent_of_the_trace(model, tuning, knobs):
    from memfit.trace.run import run_trace

    s = _scenario(model, tuning, **knobs)
    est, traced = _peak(estimate(s).allocated), _peak(run_trace(s).profile)
    assert abs(est - traced) / traced <= 0.03, (est, traced)


@pytest.mark.parametrize("tuning", ["trainable_tokens", "lora"])
def test_trainable_parameters_equal_peft_on_the_built_model(tuning):
    from memfit.trace.build import build_model

    s = _scenario("qwen2.5-0.5b", tuning, trainable_tokens=37)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_model(s)
    real = sum(p.numel() for p in built.model.parameters() if p.requires_grad)
    assert estimate(s).trainable_params == real


@pytest.mark.parametrize("flags, words", [
    (["--tuning", "trainable_tokens"], "needs the number of rows that train: --trainable-tokens N"),
    (["--tuning", "trainable_tokens", "--trainable-tokens", "-3"], "--trainable-tokens must be within [0,"),
    (["--tuning", "trainable_tokens", "--trainable-tokens", "151937"], "is more than the 151936 rows"),
    (["--tuning", "ia3", "--trainable-tokens", "8"], "goes with --tuning trainable_tokens or LoRA"),
    (["--tuning", "trainable_tokens", "--trainable-tokens", "8", "--loss", "liger"], "is modelled with --loss"),
])
def test_a_bad_token_count_is_one_line_on_the_command_line(flags, words):
    out = subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", "estimate", "Qwen/Qwen2.5-0.5B", "--gpu",
                          "a100-80gb", *flags], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("memfit: error: ") and len(out.stderr.strip().splitlines()) == 1
    assert words in out.stderr
