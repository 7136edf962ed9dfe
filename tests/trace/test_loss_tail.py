"""The logits and loss of each transformers release, as its own modeling code holds them (data/loss_tail.toml,
measured by memfit/trace/loss_tail.py): the pinned release's row is re-measured here, memfit's formula for the
pinned release equals it for every family, and a run that names an older release is estimated with that release's
row (Llama-style models upcast and copy the logits in the model's forward there; GPT-2-style ones kept 16-bit)."""
from dataclasses import replace

import pytest

from memfit.errors import MemfitError
from memfit.facts import loss_tail as facts
from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.facts.versions import pinned
from memfit.memory.activations import _logits

PINNED = pinned()["transformers"]
N, V = 4096, 32000


def _scenario(model="llama-3-8b", versions=None, **knobs):
    return build_scenario(find_model(model), Hardware(gpu=find_gpu("a100-80gb")),
                          {"tuning": "lora", "precision": "bf16-pure", **knobs}, "hf-trainer", versions=versions)


def _table():
    return facts._table()["transformers"]


def test_the_table_was_measured_on_the_pinned_torch_and_holds_the_pinned_transformers():
    assert {block["torch"] for block in _table().values()} == {pinned()["torch"]}
    assert facts.measured_release(PINNED) == PINNED


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_pinned_row_is_what_the_installed_transformers_holds(family):
    pytest.importorskip("transformers")
    import torch

    from memfit.trace.loss_tail import per_logit

    row = _table()[PINNED]["families"][family]
    measured = per_logit(family, torch.bfloat16)
    assert [measured["forward_peak"], measured["saved"], measured["backward_peak"]] == row["bf16"], \
        "re-measure: python -m memfit.trace.loss_tail --toml"


@pytest.mark.parametrize("family", sorted(facts._table()["transformers"][pinned()["transformers"]]["families"]))
@pytest.mark.parametrize("precision, column", [("bf16-pure", "bf16"), ("fp32", "fp32")])
def test_memfits_formula_for_the_pinned_release_is_the_measured_row(family, precision, column):
    s = _scenario(precision=precision)
    s = replace(s, model=replace(s.model, arch=family, logit_softcap=False))
    b = 4 if precision == "fp32" else 2
    assert [x / (N * V) for x in _logits(s, N, V, b)] == _table()[PINNED]["families"][family][column]


def test_an_older_release_is_estimated_with_its_own_row():
    new = _logits(_scenario(), N, V, 2)
    old = _logits(_scenario(versions={"transformers": "4.44.2"}), N, V, 2)
    assert old[0] == N * V * 12 > new[0] == N * V * 10  # fp32 upcast in the forward, then a shifted fp32 copy
    bloom = dict(model="bigscience/bloomz-7b1", versions={"transformers": "4.44.2"})
    bloom_old = _logits(_scenario(**bloom, autocast=False), N, V, 2)
    assert bloom_old[0] < new[0]  # GPT-2-style families (BLOOM) kept 16-bit logits and a 16-bit log_softmax then
    # ... which autocast's cross entropy turns into an fp32 copy and an fp32 log_softmax (HF Trainer's bf16=True)
    assert _logits(_scenario(**bloom, autocast=True), N, V, 2)[0] == N * V * 12 > bloom_old[0]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_autocast_changes_nothing_where_the_loss_upcasts_by_itself(family):
    """The pinned release's loss upcasts the logits itself: under autocast the row is the same, re-measured."""
    pytest.importorskip("transformers")
    import torch

    from memfit.trace.loss_tail import per_logit

    row = _table()[PINNED]["families"][family]
    measured = per_logit(family, torch.bfloat16, autocast=True)
    assert [measured["forward_peak"], measured["saved"], measured["backward_peak"]] == row["bf16_autocast"] == row["bf16"]
    s = _scenario(autocast=True)
    s = replace(s, model=replace(s.model, arch=family, logit_softcap=False))
    assert [x / (N * V) for x in _logits(s, N, V, 2)] == row["bf16_autocast"]


def test_every_release_has_each_column_for_each_family():
    columns = {"bf16", "fp32", "bf16_inplace_ce", "fp32_inplace_ce", "bf16_autocast"}
    for release, block in _table().items():
        for family, row in block["families"].items():
            assert set(row) == columns, (release, family)


def test_the_release_and_a_guessed_family_are_said_under_assumed():
    s = _scenario("qwen2.5-7b", versions={"transformers": "4.44"})
    assert any("transformers 4.44.2's own code" in a for a in s.assumed)
    unmeasured = _scenario("THUDM/glm-4-9b-chat", versions={"transformers": "4.44"})
    assert any("largest measured family" in a for a in unmeasured.assumed)
    largest = max(f["bf16"][0] for f in _table()["4.44.2"]["families"].values())
    assert _logits(unmeasured, N, V, 2)[0] == N * V * largest


def test_an_in_place_cross_entropy_holds_less_than_the_standard_one():
    standard, inplace = _logits(_scenario(), N, V, 2), _logits(_scenario(loss="inplace_ce"), N, V, 2)
    assert inplace[0] < standard[0] and inplace[2] < standard[2]
    assert any("logits and loss as measured" in a for a in _scenario(loss="inplace_ce").assumed)


def test_a_release_outside_the_measured_ranges_is_refused_before_it_is_estimated():
    with pytest.raises(MemfitError, match="known ranges"):
        _scenario(versions={"transformers": "3.5.0"})
