"""The planner's search stops after a budget of estimates, not a wall-clock time: the same plan on a loaded
machine, and a plan that stopped early says so (text and --json) with the flag that lets it go on."""
from __future__ import annotations

import json

from memfit.interfaces.cli.main import main
from memfit.planner.plan import search_plans
from memfit.planner.space import BUDGET, Options

QWEN = ["plan", "qwen2-7b", "--gpu", "rtx4090", "--gpus", "4", "--seq", "2048", "--allow", "lora,qlora"]


def test_a_small_budget_stops_the_search_and_says_so_in_text_and_json(capsys):
    assert main([*QWEN, "--budget", "3"]) == 0
    out = capsys.readouterr().out
    assert "the search stopped at its budget of 3 estimates" in out and "--budget 6" in out
    assert main([*QWEN, "--budget", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the budget is looked at between model-state settings: one setting's activation search runs to its end
    assert doc["search"]["cut_short"] and doc["search"]["budget"] == 3 and doc["search"]["estimates"] >= 3


def test_the_default_budget_leaves_the_usual_searches_whole(capsys):
    assert main([*QWEN, "--json"]) == 0
    search = json.loads(capsys.readouterr().out)["search"]
    assert not search["cut_short"] and search["budget"] == BUDGET and search["estimates"] < BUDGET / 4


def test_a_budget_is_a_count_so_the_plan_does_not_depend_on_the_clock(scenario):
    base = scenario(model="qwen2-7b", gpu="rtx4090", gpus=4, seq_len=2048)
    runs = [search_plans(base, {"lora"}, options=Options(budget=40)) for _ in range(2)]
    assert runs[0].estimates == runs[1].estimates
    assert [r.scenario for r in runs[0].rows] == [r.scenario for r in runs[1].rows]
