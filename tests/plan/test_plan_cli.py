"""`memfit plan` on the command line: tables or JSON; bad input is one line and exit code 2."""
import json

import pytest

from memfit.cli import _Parser
from memfit.errors import MemfitError
from memfit.plan_cli import add_plan_command

QWEN = ["plan", "Qwen/Qwen2-7B-Instruct", "--gpu", "rtx4090", "--gpus", "4", "--profile", "openrlhf", "--tuning",
        "full", "--zero", "3", "--micro-batch", "4", "--seq", "128", "--ckpt", "--attn", "flash"]


def _parser():
    """memfit's parser once cli.build_parser registers `plan`; until then one with `plan` alone."""
    from memfit.cli import build_parser

    try:
        build_parser().parse_args(["plan", "qwen2-7b", "--gpu", "rtx4090"])
        return build_parser()
    except MemfitError:
        parser = _Parser(prog="memfit")
        add_plan_command(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
        return parser


def run(argv) -> int:
    args = _parser().parse_args(argv)
    return args.run(args)


def test_plan_json_has_the_start_and_fitting_rows(capsys):
    assert run(QWEN + ["--allow", "lora", "--top", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "memfit.plan/1"
    assert doc["start"]["verdict"] == "oom"
    assert 1 <= len(doc["rows"]) <= 3
    for row in doc["rows"]:
        assert row["verdict"] in ("fits", "tight")
        assert row["config"]["global_batch"] == 16
        assert all({"knob", "before", "after", "device_saving_bytes", "speed_cost_pct"} <= set(c)
                   for c in row["changes"])


def test_plan_table_names_each_change(capsys):
    assert run(QWEN) == 0
    out = capsys.readouterr().out
    assert "configurations that fit" in out
    assert "optimizer offload none -> cpu" in out and "needed to fit" in out


def test_bad_allow_is_one_clear_error():
    with pytest.raises(MemfitError, match="--allow"):
        run(QWEN + ["--allow", "lora,fp4"])


def test_bad_top_is_refused():
    with pytest.raises(MemfitError, match="--top"):
        run(QWEN + ["--top", "0"])


def test_dpo_is_not_planned_yet():
    with pytest.raises(MemfitError, match="sft and pt"):
        run(QWEN + ["--method", "dpo"])
