"""`memfit plan` on the command line: tables or JSON; bad input is one line and exit code 2."""
import json

import pytest

import cards
from memfit.errors import MemfitError
from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser

QWEN = ["plan", "Qwen/Qwen2-7B-Instruct", "--gpu", "rtx4090", "--gpus", "4", "--profile", "openrlhf", "--tuning",
        "full", "--zero", "3", "--micro-batch", "4", "--seq", "128", "--ckpt", "--attn", "flash"]


def run(argv) -> int:
    args = build_parser().parse_args(argv)
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


GLM_DPO = ["plan", "THUDM/glm-4-9b-chat", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method",
           "dpo", "--zero", "3", "--micro-batch", "1", "--seq", "2048", "--ckpt", "--attn", "eager",
           "--global-batch", "128"]
QWEN72 = ["plan", "Qwen/Qwen2.5-72B-Instruct", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--zero",
          "3", "--offload-optimizer", "cpu", "--micro-batch", "1", "--seq", "2048", "--ckpt", "--host-ram", "1.4TB"]


def test_dpo_plan_json_leads_with_flash_attention(capsys):
    """On a card where flash attention alone makes the DPO run fit (tests/cards.py), it is the whole plan."""
    base = scenario_from_args(build_parser().parse_args(GLM_DPO))
    assert run(GLM_DPO + cards.gpu_mem(cards.card(base, {"attention": "flash"})) + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["method"] == "dpo" and doc["start"]["verdict"] == "oom"
    first = doc["rows"][0]
    assert {(c["knob"], c["after"]) for c in first["changes"]} == {("attention", "flash")}
    assert first["config"]["global_batch"] == 128 and "ref_offload" in first["config"]


def test_code_edits_are_printed_with_the_function_and_keys(capsys):
    assert run(QWEN72 + ["--no-resume"]) == 0
    out = capsys.readouterr().out
    assert "needs a code edit" in out and "get_train_ds_config" in out
    assert 'zero_opt_dict["offload_optimizer"]' in out


def test_without_code_edits_the_72b_run_has_no_plan_and_its_resume_needs_ratio(capsys):
    assert run(QWEN72 + ["--no-resume", "--no-code-edits", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == [] and doc["closest_miss"]["verdict"] == "host_oom"
    assert doc["code_edits_searched"] is False and doc["resume_judged"] is False
    # at a resume every rank loads 4 B x its partition beside the offloaded states: only moving sub-groups
    # to the GPUs (ratio < 1, a code edit) brings the node under 1.4 TB
    assert run(QWEN72 + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(r["host_peak_bytes"] <= 1.4e12 for r in rows)
    for r in rows:
        ratio = [c for c in r["changes"] if c["knob"] == "ratio"]
        assert ratio and ratio[0]["after"] < 1 and ratio[0]["code_edit"]


def test_a_run_with_an_unread_setting_says_why_nothing_fits_and_what_to_do(tmp_path, capsys):
    """A memory flag no reader reads caps every estimate at "tight" (issue 27): the plan names it and the next step,
    not "try --allow", which could not help."""
    launch = tmp_path / "train.sh"
    launch.write_text("python train.py --model_name_or_path Qwen/Qwen2.5-0.5B --per_device_train_batch_size 2 "
                      "--max_seq_len 4096 --bf16 true\n")
    assert run(["plan", "--from", str(launch), "--gpu", "h100"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal width
    assert "no configuration can be called fits" in out and "--allow" not in out
    assert "not read: " in out and "--max_seq_len 4096" in out
    assert "next: state each setting in a form memfit reads" in out and "closest:" not in out
    assert run(["plan", "--from", str(launch), "--gpu", "h100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == [] and doc["closest_miss"] is None
    assert len(doc["not_read"]) == 1 and "--max_seq_len 4096" in doc["not_read"][0]
