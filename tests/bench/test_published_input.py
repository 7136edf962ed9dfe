"""bench/published.py reads every shape a case's free-text fields come in."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import published  # noqa: E402


def test_lora_targets_as_a_list_or_as_text():
    assert published._lora_targets({"lora_targets": ["q_proj", "v_proj"]}) == ("q_proj", "v_proj")
    assert published._lora_targets({"lora_targets": "q,v,output_proj + MLP"}) == (
        "q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert published._lora_targets({"lora_targets": ["all-linear"]}) is None
