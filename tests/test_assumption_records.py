"""build_scenario never changes what it is given, and every assumption is a record (memfit/facts/assumptions.py):
its knob, the value taken, where it came from, and the same prose the text output prints."""
from __future__ import annotations

import copy
import json
from types import MappingProxyType

import pytest

from memfit.errors import MemfitError
from memfit.facts.assumptions import SOURCES, Assumption, records
from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware, Scenario
from memfit.interfaces.cli.main import main

# each exercises a path that used to edit its inputs: a profile's ZeRO default (openrlhf), a framework's
# several-device engine and checkpointing (litgpt, torchtune), a file's inert key, a dict and a list to convert
RUNS = [
    ("llama3.1-8b", 4, "openrlhf", {"tuning": "lora", "lora_targets": ["q_proj", "v_proj"], "fsdp_cpu_offload": True}),
    ("llama3.1-8b", 2, "litgpt", {"tuning": "lora"}),
    ("llama3.1-8b", 2, "torchtune", {"tuning": "full", "seq_len": 512}),
    ("qwen2-7b", 8, "openrlhf", {"method": "ppo", "role_gpus": {"actor": 4, "critic": 4}, "colocate": "none"}),
]


def _hardware(gpus: int) -> Hardware:
    return Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=gpus)


@pytest.mark.parametrize("model, gpus, profile, given", RUNS, ids=[r[2] for r in RUNS])
def test_build_scenario_leaves_its_inputs_as_they_were(model, gpus, profile, given):
    spec, hw, versions = find_model(model), _hardware(gpus), {"transformers": "5.24.0"}
    before = copy.deepcopy((spec, hw, given, versions))
    s = build_scenario(spec, hw, MappingProxyType(given), profile, versions=MappingProxyType(versions))
    assert (spec, hw, given, versions) == before
    assert s.hardware is hw and isinstance(s.lora_targets, tuple) and isinstance(s.role_gpus, tuple)
    again = build_scenario(spec, hw, given, profile, versions=versions)
    assert again == s and again.assumed == s.assumed  # nothing carried over from the first call


def test_each_assumption_is_a_record_with_a_known_source():
    s = build_scenario(find_model("llama3.1-8b"), _hardware(4), {"tuning": "lora", "fsdp_cpu_offload": True},
                       "openrlhf")
    assert s.assumed and all(isinstance(a, Assumption) and a.source in SOURCES for a in s.assumed)
    by_knob = {a.knob: a for a in s.assumed if a.knob}
    assert by_knob["engine"].source == "profile" and by_knob["engine"].value == "deepspeed"
    assert by_knob["fsdp_cpu_offload"].source == "config" and str(by_knob["fsdp_cpu_offload"]).startswith("ignored")
    for a in s.assumed:  # a profile's default is the value the run holds
        if a.source == "profile" and a.knob:
            assert getattr(s, a.knob) == a.value, a


def test_a_release_default_names_the_release():
    s = build_scenario(find_model("llama3.1-8b"), _hardware(1), {"tuning": "lora"}, "trl",
                       versions={"trl": "0.8.6"})
    sources = {a.source for a in s.assumed}
    assert "release" in sources, s.assumed
    assert all(a.knob is None or a.knob in {f for f in Scenario.__dataclass_fields__} for a in s.assumed)


def test_an_unknown_source_is_refused():
    with pytest.raises(ValueError, match="source 'guess'"):
        Assumption("x", "guess")


def test_plain_notes_read_as_memfits_own():
    assert records(["a note"]) == [{"knob": None, "value": None, "source": "memfit", "text": "a note"}]


def test_estimate_json_lists_the_records_beside_the_same_prose(capsys):
    code = main(["estimate", "llama3.1-8b", "--gpu", "rtx4090", "--gpus", "2", "--tuning", "lora", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [r["text"] for r in doc["assumption_records"]] == doc["assumptions"]
    assert all(r["source"] in SOURCES for r in doc["assumption_records"])
    knobs = {r["knob"]: r for r in doc["assumption_records"] if r["knob"]}
    assert knobs["engine"] == {"knob": "engine", "value": "ddp", "source": "memfit",
                               "text": "engine=ddp (several GPUs, no ZeRO/FSDP given)"}
    assert knobs["attention"]["source"] == "profile" and knobs["attention"]["value"] == "sdpa"


def test_a_typed_inert_knob_is_still_an_error():
    with pytest.raises(MemfitError, match="no effect here"):
        build_scenario(find_model("llama3.1-8b"), _hardware(1), {"fsdp_cpu_offload": True}, typed={"fsdp_cpu_offload"})
