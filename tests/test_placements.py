"""The RL placement interface (memfit/roles/placement.py) and its table (data/placements.toml): the estimate
runs the placement a framework declares; a declaration alone is enough to place a run; the table loads strictly."""
from __future__ import annotations

import pytest

from memfit.errors import MemfitError
from memfit.facts import data_table, placements
from memfit.roles import placement as generic
from memfit.roles.estimate import DECLARATIONS, estimate
from memfit.roles.frozen import frozen_role
from memfit.roles.placement import Declaration, Step, Worker, role_scenario
from memfit.roles.trained import trained_role


def test_every_placement_row_has_its_code_and_every_method_one_fallback():
    rows = placements.placements()
    assert set(rows) == set(DECLARATIONS)
    methods = {m for r in rows.values() for m in r.methods}
    assert {"sft", "dpo", "ppo", "grpo"} <= methods
    for m in methods:
        assert sum(m in r.methods and r.fallback for r in rows.values()) == 1, m


def test_the_framework_row_picks_the_placement_not_the_method():
    assert placements.placement_for("openrlhf", "ppo").name == "openrlhf"
    assert placements.placement_for("trl", "grpo").name == "openrlhf"  # no RL layout of its own: the fallback
    assert placements.placement_for("openrlhf", "dpo").name == "one_process"


def test_a_method_no_placement_runs_is_one_clear_line():
    with pytest.raises(MemfitError) as e:
        placements.placement_for("openrlhf", "reinforce")
    assert "\n" not in str(e.value) and "methods placed:" in str(e.value)


@pytest.fixture
def placements_copy(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(data_table.DATA, tmp_path / "data")
    monkeypatch.setattr(data_table, "DATA", tmp_path / "data")
    data_table.data_table.cache_clear()
    placements.placements.cache_clear()
    yield tmp_path / "data" / "placements.toml"
    data_table.data_table.cache_clear()
    placements.placements.cache_clear()


def test_a_mistyped_placement_key_names_the_row_and_the_nearest_key(placements_copy):
    text = placements_copy.read_text().replace("\nfallback = true  #", "\nfalback = true  #", 1)
    placements_copy.write_text(text)
    with pytest.raises(MemfitError) as e:
        placements.placements()
    assert "\n" not in str(e.value)
    assert "[placement.openrlhf]" in str(e.value) and "did you mean 'fallback'" in str(e.value)


def test_two_fallbacks_for_one_method_are_refused(placements_copy):
    other = '\n[placement.other]\ndescription = "x"\nmethods = ["ppo"]\nframeworks = []\nfallback = true\nsource = "x"\n'
    placements_copy.write_text(placements_copy.read_text() + other)
    with pytest.raises(MemfitError, match="two fallbacks"):
        placements.placements()


def _one_pool_declaration(s, ref_sleeps_in_its_own_process: bool) -> Declaration:
    """A framework written as one declaration: policy and reference on the same 8 GPUs."""
    rs = role_scenario(s, 8)
    policy = Worker("policy", "actor", "all", trained_role(rs, 1, "fp32_cast"), train_rows=1, score_rows=2)
    ref_process = "ref" if ref_sleeps_in_its_own_process else "actor"
    ref = Worker("reference", ref_process, "all", frozen_role(rs, s.model, 2, "fp32_cast", False, False),
                 score_rows=2)
    steps = [Step("load", "load", (("policy", "load"),)), Step("experience:reference", "forward",
                                                              (("reference", "score"),)),
             Step("train:backward", "backward", (("policy", "backward"),))]
    return Declaration(s, {"all": 8}, [policy, ref], steps)


def test_a_declaration_alone_places_a_run(scenario):
    s = scenario(model="qwen2-7b", gpu="h100-sxm", gpus=8, method="grpo", profile="openrlhf", zero_stage=3,
                 seq_len=1024)
    own = generic.place(_one_pool_declaration(s, True))
    shared = generic.place(_one_pool_declaration(s, False))
    assert [r.role for r in own.roles] == ["policy", "reference"]
    assert own.groups[0].processes == ("actor", "ref") and shared.groups[0].processes == ("actor",)
    # a second process pays a second CUDA context and NCCL communicator on every GPU: the placement decides it
    assert own.groups[0].peak > shared.groups[0].peak
    assert set(own.groups[0].moments) == {"load", "experience:reference", "train:backward"}


def test_a_state_a_worker_cannot_be_in_is_one_clear_line(scenario):
    s = scenario(model="qwen2-7b", gpu="h100-sxm", gpus=8, method="grpo", profile="openrlhf", seq_len=1024)
    d = _one_pool_declaration(s, True)
    d.steps.append(Step("bad", "forward", (("reference", "backward"),)))
    with pytest.raises(MemfitError, match="the reference cannot be in state 'backward'"):
        generic.place(d)


def test_openrlhf_ppo_runs_through_its_declaration(scenario):
    s = scenario(model="qwen2-7b", gpu="a100-80gb", gpus=8, method="ppo", profile="openrlhf", colocate="all",
                 deepspeed_sleep=True, vllm_sleep=True, seq_len=1024)
    e = estimate(s)
    assert [r.role for r in e.roles] == ["policy", "critic", "reference", "reward", "generator"]
    moments = set(e.group().moments)
    assert {"load:vllm", "generate", "experience:reference", "train_policy:backward", "train_critic:backward",
            "weight_sync"} <= moments


def test_a_declaration_without_a_trained_policy_is_one_clear_line(scenario):
    s = scenario(model="qwen2-7b", gpu="h100-sxm", gpus=8, method="grpo", profile="openrlhf", seq_len=1024)
    d = _one_pool_declaration(s, True)
    no_policy = Declaration(s, d.pools, [d.workers[1]], [d.steps[1]])
    with pytest.raises(MemfitError, match="no policy worker is declared; roles declared: reference"):
        generic.place(no_policy)
    frozen = Worker("policy", "actor", "all", d.workers[1].model, score_rows=2)
    frozen_policy = Declaration(s, d.pools, [frozen, d.workers[1]], [d.steps[1]])
    with pytest.raises(MemfitError, match="the policy worker holds a FrozenRole, not a model that trains") as e:
        generic.place(frozen_policy)
    assert "\n" not in str(e.value)
