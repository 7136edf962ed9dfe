"""bench/peer_fitcheck.py: fitcheck-llm answers a case in bytes; a case it cannot read is skipped with a reason."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

pytest.importorskip("fitcheck")  # extra `peers`
pytest.importorskip("transformers")  # the config.json fitcheck reads is written by transformers' config class

import peer_fitcheck  # noqa: E402

LLAMA_31_8B_PARAMS = 8_030_261_248  # the hub's safetensors count, which fitcheck checks its formula against


def test_a_lora_case_is_a_positive_number_of_bytes(scenario):
    s = scenario(model="llama-3.1-8b", gpu="a100-80gb", tuning="lora", lora_rank=16, micro_batch=2, seq_len=1024,
                 checkpointing="full", attention="sdpa")
    a = peer_fitcheck.fitcheck_answer(s, LLAMA_31_8B_PARAMS)
    assert isinstance(a.value, int) and a.value > 0
    assert a.applies and a.label == "fits"
    assert 16e9 < a.value < 30e9  # bf16 weights of an 8B model plus a little: bytes, not MiB


def test_a_malformed_config_is_skipped_with_the_reason(scenario, tmp_path):
    s = scenario(model="llama-3.1-8b", gpu="a100-80gb", tuning="lora")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32}))  # no hidden_size
    a = peer_fitcheck.answer(s, peer_fitcheck.load_model(path, "org/broken", None))
    assert a.value is None and not a.applies
    assert "hidden_size" in a.note


def test_a_knob_it_has_no_input_for_is_skipped_with_the_reason(scenario):
    s = scenario(model="llama-3.1-8b", gpu="a100-80gb", tuning="ia3")
    a = peer_fitcheck.fitcheck_answer(s, LLAMA_31_8B_PARAMS)
    assert a.value is None and "tuning ia3" in a.note
