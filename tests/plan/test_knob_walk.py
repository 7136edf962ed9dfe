"""Every choice of every knob of memfit/facts/data/knobs.toml reaches `memfit plan` and the step-time model without
a traceback (issue 29: `--loss inplace_ce` had no speed.toml entry). Each value is set where its knob acts (the
table's `when` / `needs`), on a small model with a short search; a combination the frameworks refuse is one
clear line and exit 2, anything else must plan."""
import math

import pytest

from memfit.facts.knobs import knobs
from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser, main
from memfit.planner.step_time import step_time

BASE = ["plan", "Qwen/Qwen2-0.5B-Instruct", "--gpu", "a100-80gb", "--seq", "256", "--top", "1"]
# where each `when` / `needs` condition of the knob table holds
CONTEXT = {"deepspeed": ["--engine", "deepspeed", "--zero-stage", "3", "--gpus", "2"],
           "fsdp": ["--engine", "fsdp", "--gpus", "2"], "adapters": ["--tuning", "lora"], "qlora": ["--tuning", "qlora"],
           "freeze": ["--tuning", "freeze"], "virtual_tokens": ["--tuning", "prompt"],
           "every_n": ["--checkpointing", "every_n"], "several": ["--method", "dpo"],
           "offload": ["--offload-optimizer", "cpu"], "zero3": []}


def _cases():
    for name, k in knobs().items():
        values = list(k.choices) if k.choices else [True, False] if k.type == "bool" else []
        context = CONTEXT.get(k.when or "", []) + CONTEXT.get(getattr(k, "needs", None) or "", [])
        for v in values:
            if k.type == "bool":
                flag = [k.flag if v else "--no-" + k.flag[2:]]
            else:
                flag = [k.flag, str(v)]
            yield pytest.param(context + flag, id=f"{name}={v}")


CASES = list(_cases())


def test_the_walk_covers_every_choice_of_every_knob():
    with_choices = [k for k in knobs().values() if k.choices or k.type == "bool"]
    assert len(CASES) == sum(len(k.choices) if k.choices else 2 for k in with_choices)
    assert any("inplace_ce" in c.id for c in CASES)


@pytest.mark.parametrize("flags", CASES)
def test_every_knob_value_plans_and_times_without_a_traceback(flags, monkeypatch, capsys):
    monkeypatch.setattr("memfit.planner.space.BUDGET", 40)  # the walk checks for tracebacks, not the best plan
    code = main([*BASE, *flags])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:  # refused: one line naming the problem
        assert err.startswith("memfit: error: ") and err.count("\n") == 1, err
        return
    s = scenario_from_args(build_parser().parse_args(["estimate", *BASE[1:6], *flags]))
    st = step_time(s)
    assert st.seconds > 0 and math.isfinite(st.seconds) or st.tokens_per_second == 0


def test_inplace_ce_has_a_loss_cost_between_liger_and_standard(scenario):
    kw = dict(model="Qwen/Qwen2-0.5B-Instruct", gpu="a100-80gb", tuning="full", micro_batch=4, seq_len=2048)
    loss = {name: step_time(scenario(**kw, loss=name)).breakdown["loss"] for name in ("standard", "inplace_ce")}
    assert 0 < loss["inplace_ce"] < loss["standard"]
