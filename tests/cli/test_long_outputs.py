"""Issue 30: a several-model estimate (DPO, PPO, GRPO) prints 100+ lines; its first lines are the answer and a line
per role (GPUs, its own peak GiB, when), then the detail. `--brief` prints the summary and the next steps alone,
`--detail` (the default) everything. `memfit plan` has the same two, and ends with its next step, a command that
reproduces plan 1."""
import json
import shlex

import pytest

from memfit.interfaces.cli.main import main
from memfit.interfaces.render.common import gib

PPO = ["estimate", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method", "ppo",
       "--zero", "3", "--micro-batch", "4", "--seq", "2048", "--ckpt", "--colocate", "all", "--vllm-tp", "2",
       "--vllm-mem", "0.5"]
DPO = ["estimate", "Qwen/Qwen2-7B-Instruct", "--gpu", "h100", "--gpus", "8", "--method", "dpo", "--tuning", "full",
       "--zero", "3"]
SFT = ["estimate", "Qwen/Qwen2-0.5B-Instruct", "--gpu", "a100-80gb", "--seq", "1024", "--micro-batch", "4"]


def _lines(capsys, argv) -> list[str]:
    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


def _json(capsys, argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv", [PPO, DPO], ids=["ppo", "dpo"])
def test_the_summary_follows_the_answer_line_with_each_roles_own_peak(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")  # one printed line per summary line
    doc = _json(capsys, argv)
    lines = _lines(capsys, argv)
    assert lines[0].split(":")[0] in ("FITS", "TIGHT", "OOM")
    assert lines[1].startswith(f"roles of {doc['method']}")
    groups = {g["name"]: g for g in doc["gpu_groups"]}
    for i, role in enumerate(doc["roles"], 2):  # one line per role, in the roles' order
        moments = groups[role["group"]]["moments"]
        own = max(m[role["role"]]["total"] for m in moments.values() if role["role"] in m)
        words = lines[i].split()
        assert words[0] == role["role"] and int(words[1]) == role["gpus"], lines[i]
        assert words[3] == gib(own), lines[i]  # the device total at its own peak, from the JSON's moments
    group_line = lines[2 + len(doc["roles"])]
    worst = groups[doc["worst_gpu_group"]]
    assert f"{gib(worst['peak_bytes'])} of {gib(doc['gpu_memory_bytes'])} GiB at {worst['peak_moment']}" in group_line


def test_brief_is_the_summary_and_the_next_steps_and_detail_is_the_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    every = _lines(capsys, PPO)
    assert _lines(capsys, [*PPO, "--detail"]) == every
    brief = _lines(capsys, [*PPO, "--brief"])
    assert len(every) > 60 and len(brief) <= 15, (len(every), len(brief))
    summary = 2 + 5 + 1  # the answer, the heading, five roles, the group
    assert brief[:summary] == every[:summary]
    assert every[-3:] == brief[-3:]  # the same next steps end both
    assert brief[-1].startswith("more (combinations, the fastest that fit): memfit plan ")
    assert not any("assumed:" in line or "what drives the peak" in line for line in brief)


def test_brief_and_detail_are_one_or_the_other(capsys):
    assert main([*PPO, "--brief", "--detail"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--brief" in err and "--detail" in err


def test_a_single_model_run_has_no_role_summary(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    lines = _lines(capsys, SFT)
    assert not any(line.startswith("roles of") for line in lines)
    brief = _lines(capsys, [*SFT, "--brief"])
    assert brief[0] == lines[0] and brief[-1] == lines[-1] and len(brief) <= 4


PLAN = ["plan", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method", "ppo",
        "--zero", "3", "--micro-batch", "4", "--seq", "2048", "--ckpt", "--colocate", "all", "--vllm-tp", "2",
        "--vllm-mem", "0.5", "--top", "3"]


def test_plan_brief_keeps_the_table_and_ends_with_a_command_that_is_plan_one(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    doc = _json(capsys, PLAN)
    every = _lines(capsys, PLAN)
    brief = _lines(capsys, [*PLAN, "--brief"])
    assert brief[0] == every[0] and brief[-1] == every[-1] and len(brief) < len(every)
    assert not any(line.lstrip().startswith("1. ") for line in brief)  # the numbered changes are detail
    last = next(i for i in range(len(every) - 1, -1, -1) if every[i].startswith("next: "))
    assert all(line.endswith(" \\") for line in every[last:-1])  # a long command wraps as shell continuations
    command = " ".join(line.removesuffix(" \\").strip() for line in every[last:]).split("launch it: ", 1)[1]
    assert command == doc["next_command"] and command.startswith("memfit estimate ")
    again = _json(capsys, shlex.split(command)[1:])  # the next step, run: it is plan 1
    assert again["verdict"] == doc["rows"][0]["verdict"] == "fits"
    assert again["per_rank"]["device_total"]["peak_bytes"] == doc["rows"][0]["device_peak_bytes"]
