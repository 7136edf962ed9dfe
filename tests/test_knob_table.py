"""The knob table (memfit/facts/data/knobs.toml) is the only place a knob is declared: the Scenario, the command
line and the framework profiles use its names and nothing else."""
import dataclasses

import pytest

from memfit.errors import MemfitError
from memfit.facts.knobs import axes, hardware, inputs, knobs
from memfit.facts.frameworks import frameworks
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Scenario
from memfit.interfaces.cli.main import build_parser

# options of a command that are not knobs: what the command does with the run, not what the run is
COMMAND_OPTIONS = {"--json", "--help", "-h", "--steps", "--timeline", "--compare", "--weights", "--global-batch",
                   "--allow", "--top", "--no-code-edits", "--no-resume", "--out", "--in-place", "--model",
                   "--max-seq", "--max-batch", "--html", "--save", "--follow", "--capacity", "--until-steps", "--interval",
                   "--lengths", "--seed", "--epochs", "--group-by-length", "--drop-last", "--sampler", "--estimate-from",
                   "--port", "--host", "--allow-remote", "--tokens", "--price-per-gpu-hour", "--budget", "--brief", "--detail",
                   "--row"}


def _subparsers():
    parser = build_parser()
    return parser._subparsers._group_actions[0].choices  # the one place argparse keeps them


def test_scenario_fields_are_the_knobs():
    fields = [f.name for f in dataclasses.fields(Scenario)]
    assert fields == ["model", "hardware", *knobs(), "profile", "releases", "assumed", "unread"]


def test_every_flag_is_a_knob_or_a_command_option():
    declared = set()
    for k in (*knobs().values(), *hardware().values(), *inputs().values()):
        for flag in (k.flag, *k.aliases):
            declared |= {flag, "--no-" + flag[2:]} if k.type == "bool" else {flag}
    for name, sub in _subparsers().items():
        for action in sub._actions:
            for option in action.option_strings:
                assert option in declared or option in COMMAND_OPTIONS, (name, option)


def test_every_knob_has_its_flag_and_dest_on_estimate_and_plan():
    subs = _subparsers()
    for command in ("estimate", "plan", "trace", "measure"):
        dests = {a.dest: a.option_strings for a in subs[command]._actions}
        for name, k in (*knobs().items(), *hardware().items()):
            assert name in dests, (command, name)
            assert k.flag in dests[name] and set(k.aliases) <= set(dests[name]), (command, name)


def test_a_flag_spelled_by_its_alias_lands_in_the_same_knob():
    a = build_parser().parse_args(["estimate", "qwen2-7b", "--gpu", "a100-80gb", "--zero", "3", "--seq", "512",
                                   "--ckpt", "--attn", "eager", "--gpus", "2"])
    assert (a.zero_stage, a.seq_len, a.checkpointing, a.attention, a.gpus_per_node) == (3, 512, "full", "eager", 2)


def test_profiles_set_only_knobs_the_table_lets_them_set():
    settable = {name for name, k in knobs().items() if k.profile} | {"zero_stage"}
    for name, fw in frameworks().items():
        assert set(fw.defaults) <= settable, (name, set(fw.defaults) - settable)


def test_axes_name_only_knobs_and_cover_each_knob_once():
    members = [k for names in axes().values() for k in names]
    assert set(members) <= set(knobs())
    assert len(members) == len(set(members))


def test_build_scenario_refuses_a_name_outside_the_table():
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.scenario import Hardware

    with pytest.raises(MemfitError, match="unknown knob 'seq'"):
        build_scenario(find_model("qwen2-7b"), Hardware(gpu=find_gpu("a100-80gb")), {"seq": 512})


def test_the_planner_changes_only_axes_of_the_table():
    from memfit.planner.knobs import ROLE_KNOBS, ActKnobs, StateKnobs, names

    assert set(names(StateKnobs)) | set(names(ActKnobs)) <= set(axes())
    assert set(ROLE_KNOBS) <= set(names(StateKnobs))


def test_a_plan_row_says_its_configuration_in_knob_names(scenario):
    from memfit.planner.knobs import config_of

    for s in (scenario(model="qwen2-7b", gpus=4, zero_stage=3, offload_optimizer="cpu"),
              scenario(model="qwen2-7b", gpus=4, fsdp_strategy="full_shard"),
              scenario(model="qwen2-7b", gpus=8, gpu="a100-80gb", method="dpo", zero_stage=3)):
        assert set(config_of(s)) - {"global_batch"} <= set(knobs())


def test_every_change_a_plan_makes_is_an_axis_fit_can_write(scenario):
    from memfit.planner.plan import plan

    rows = plan(scenario(model="Qwen/Qwen2-7B-Instruct", gpus=4, profile="openrlhf", tuning="full", zero_stage=3,
                         micro_batch=4, seq_len=128, checkpointing="full", attention="flash"), {"lora"}, None, top_k=5)
    assert rows and all(c.knob in axes() for r in rows for c in r.changes)
