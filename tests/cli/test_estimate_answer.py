"""Issue 30 item 1: `memfit estimate`'s first line is the answer (verdict, device total against the card, margin
against the error band, the peak phase), and its last lines what to do next: for a run that does not fit, the
cheapest small changes that fit, as flags to add; each one, added to the same command, fits."""
import json
import shlex

import pytest

from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser, main
from memfit.interfaces.render.common import gib

OOM = ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--gpus-per-node", "7", "--profile",
       "llamafactory", "--tuning", "lora", "--lora-rank", "8", "--seq-len", "2048", "--precision", "bf16-pure",
       "--micro-batch", "4"]
FITS = ["estimate", "Qwen/Qwen2-0.5B-Instruct", "--gpu", "a100-80gb", "--seq", "1024", "--micro-batch", "4"]
TIGHT = ["estimate", "meta-llama/Meta-Llama-3-8B", "--gpu", "rtx3090", "--gpus", "8", "--profile", "llamafactory",
         "--tuning", "full", "--zero-stage", "3", "--precision", "fp16-mixed", "--seq-len", "1024", "--micro-batch", "1"]
PPO = ["estimate", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method", "ppo",
       "--zero", "3", "--micro-batch", "4", "--seq", "2048", "--ckpt", "--colocate", "all", "--vllm-tp", "2",
       "--vllm-mem", "0.5"]
NOTHING_FITS = ["estimate", "meta-llama/Llama-3.1-70B", "--gpu", "rtx4090", "--seq", "4096", "--micro-batch", "4"]


def _run(capsys, argv: list[str]) -> tuple[dict, str]:
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    return doc, " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines


@pytest.mark.parametrize("argv", [FITS, OOM, TIGHT, PPO], ids=["fits", "oom", "tight", "ppo"])
def test_the_first_line_is_the_verdict_against_the_card_and_the_band(capsys, argv):
    doc, out = _run(capsys, argv)
    # up to the several-model summary or the model's header line
    first = out.split(" roles of ")[0].split(" meta-llama/")[0].split(" Qwen/")[0]
    word = {"fits": "FITS", "tight": "TIGHT", "oom": "OOM"}[doc["verdict"]]
    device = doc["per_rank"]["device_total"]
    assert first.startswith(f"{word}: {gib(device['peak_bytes'])} GiB per GPU of {gib(doc['gpu_memory_bytes'])} GiB")
    assert first.endswith(f"peak at {device['peak_phase']}")
    margin = doc["margin_bytes"]
    assert (f"{gib(-margin)} GiB over" if margin < 0 else f"{gib(margin)} GiB to spare") in first
    assert "error band" in first


def test_an_oom_ends_with_changes_that_each_fit_when_added_to_the_command(capsys):
    doc, out = _run(capsys, OOM)
    assert doc["verdict"] == "oom"
    steps = doc["next_steps"]
    assert 1 <= len(steps) <= 3
    assert [s["speed_cost"] for s in steps] == sorted(s["speed_cost"] for s in steps)  # cheapest first
    for step in steps:
        assert main([*OOM, *step["flags"], "--json"]) == 0  # the user's command with the flags added
        again = json.loads(capsys.readouterr().out)
        assert again["verdict"] == "fits" and step["verdict"] == "fits"
        assert again["per_rank"]["device_total"]["peak_bytes"] == step["device_total_bytes"]
        assert " ".join(step["flags"]) in out
    # the output ends with the plan command that searches further
    assert out.rstrip().endswith(doc["plan_command"])


def test_a_tight_run_gets_changes_that_clear_the_band(capsys):
    doc, _ = _run(capsys, TIGHT)
    assert doc["verdict"] == "tight" and doc["next_steps"]
    for step in doc["next_steps"]:
        assert main([*TIGHT, *step["flags"], "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["verdict"] == "fits"


def test_a_fitting_run_ends_with_one_line_on_what_to_do_next(capsys):
    doc, _ = _run(capsys, FITS)
    assert doc["verdict"] == "fits" and doc["next_steps"] == []
    assert main(FITS) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("next: launch it") and last.endswith(doc["plan_command"])


def test_the_plan_command_starts_from_the_same_run(capsys):
    doc, _ = _run(capsys, OOM)
    words = shlex.split(doc["plan_command"])
    assert words[:2] == ["memfit", "plan"]
    planned = scenario_from_args(build_parser().parse_args(words[1:]))
    assert planned == scenario_from_args(build_parser().parse_args(OOM))


def test_when_no_small_change_fits_the_plan_command_with_allow_is_the_next_step(capsys):
    doc, out = _run(capsys, NOTHING_FITS)
    assert doc["verdict"] == "oom" and doc["next_steps"] == []
    assert out.rstrip().endswith(doc["plan_command"] + " --allow lora,qlora,8bit")


def test_the_next_steps_cost_a_bounded_number_of_estimates(monkeypatch):
    import memfit.planner.search as search
    from memfit.planner.next_steps import MAX_ESTIMATES, cheapest_changes

    calls = []
    real = search.estimate
    monkeypatch.setattr(search, "estimate", lambda s: calls.append(s) or real(s))
    base = scenario_from_args(build_parser().parse_args(NOTHING_FITS))
    assert cheapest_changes(base) == []
    assert 0 < len(calls) <= MAX_ESTIMATES


def test_a_run_read_from_a_file_names_the_fit_command_for_it(capsys):
    from pathlib import Path

    path = Path(__file__).parents[1] / "formats/examples/llamafactory/examples/train_lora/llama3_lora_sft.yaml"
    doc, out = _run(capsys, ["estimate", "--from", str(path), "--gpu", "rtx4090"])
    assert doc["plan_command"] == f"memfit plan --from {path} --gpu rtx4090"
    assert f"memfit fit {path} --gpu rtx4090" in out


def test_a_run_with_an_unread_setting_says_so_first_and_offers_no_change_as_fitting(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.1-8B-Instruct\nstage: sft\nfinetuning_type: lora\n"
                    "cutoff_len: 1024\nper_device_train_batch_size: 2\nbf16: true\nuse_unsloth: true\n")
    doc, out = _run(capsys, ["estimate", "--from", str(path), "--gpu", "h200", "--gpus", "8"])
    assert doc["verdict"] == "tight" and doc["margin_bytes"] > 0 and doc["next_steps"] == []
    assert out.startswith(f"TIGHT: {gib(doc['per_rank']['device_total']['peak_bytes'])} GiB per GPU")
    assert "were not read" in out.split("peak at")[0]
    assert out.rstrip().endswith("and estimate again")
