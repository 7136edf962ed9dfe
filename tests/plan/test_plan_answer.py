"""`memfit plan` and `memfit fit` say the answer first and name what moves their numbers: the first line is the
verdict (how many fit and the fastest, or the closest miss), the padded fill the step-time model assumes is printed
beside the ranking it moves, a negative saving reads as a cost, and a sequence past the model's positions warns."""
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

from memfit.interfaces.cli.main import build_parser
from memfit.interfaces.cli.plan import _saving
from memfit.planner.speed_constants import assumptions

GiB = 2**30
QWEN = ["plan", "Qwen/Qwen2-7B-Instruct", "--gpu", "rtx4090", "--gpus", "4", "--profile", "openrlhf", "--tuning",
        "full", "--zero", "3", "--micro-batch", "4", "--seq", "128", "--ckpt", "--attn", "flash", "--top", "3"]
QWEN72 = ["plan", "Qwen/Qwen2.5-72B-Instruct", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--zero",
          "3", "--offload-optimizer", "cpu", "--micro-batch", "1", "--seq", "2048", "--ckpt", "--host-ram", "1.4TB",
          "--no-resume", "--no-code-edits"]
LLAMA_YAML = (Path(__file__).resolve().parents[1] / "formats" / "examples" / "llamafactory" / "examples" /
              "train_lora" / "llama31_8b_lora_7x4090.yaml")


def run(argv, capsys) -> tuple[str, str]:
    args = build_parser().parse_args(argv)
    assert args.run(args) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_the_first_line_is_the_count_and_the_fastest_plan_with_its_numbers(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the answer wraps at the terminal's width; a wide one keeps it one line
    doc = json.loads(run(QWEN + ["--json"], capsys)[0])
    first = run(QWEN, capsys)[0].splitlines()[0]
    fits = sum(r["verdict"] == "fits" for r in doc["rows"])
    best = doc["rows"][0]
    m = re.fullmatch(r"(\d+) configurations? fits?(, \d+ tight)? on 4 x (.+); fastest: ([\d,]+) tokens/s "
                     r"\((.+)\), ([\d.]+) GiB per GPU", first)
    assert m, first
    assert int(m.group(1)) == fits and m.group(3) == doc["gpu"]
    assert abs(int(m.group(4).replace(",", "")) - best["tokens_per_second"]) <= 0.5  # JSON keeps one decimal
    assert float(m.group(6)) == round(best["device_peak_bytes"] / GiB, 1)


def test_when_nothing_fits_the_first_line_says_so_and_names_the_closest(capsys):
    doc = json.loads(run(QWEN72 + ["--json"], capsys)[0])
    assert doc["rows"] == [] and doc["closest_miss"]
    out = run(QWEN72, capsys)[0]
    first = out.splitlines()[0]
    assert first.startswith(f"nothing fits on 8 x {doc['gpu']}; closest: {doc['closest_miss']['verdict']}, ")
    assert out.rstrip().splitlines()[-1].startswith("next: ")


def test_the_padded_fill_is_printed_beside_a_ranking_that_counts_it(capsys):
    fill = f"{assumptions()['data']['padded_fill']:.0%}"
    out = " ".join(run(QWEN, capsys)[0].split())  # rich wraps at the terminal width
    assert f"padded fill: tokens/s assume {fill} of a padded micro-batch's positions are real tokens" in out
    # at micro-batch 1 (the global batch keeps every plan there) no batch is padded: nothing to name
    one = QWEN[:QWEN.index("--micro-batch")] + ["--micro-batch", "1"] + QWEN[QWEN.index("--micro-batch") + 2:]
    assert "padded fill" not in run(one, capsys)[0]


def test_a_negative_saving_reads_as_a_cost():
    change = SimpleNamespace(device_saving_bytes=int(-19.5 * GiB), in_plan_device_saving_bytes=int(3 * GiB),
                             measured="alone", host_saving_bytes=int(-40 * GiB))
    words = _saving(change, host_known=True)
    assert words.startswith("costs 19.5 GiB/GPU more alone (saves 3.0 in this plan)")
    assert "costs 40.0 GiB host more" in words and "-" not in words


def test_no_printed_saving_is_negative(capsys):
    out = run(QWEN72[:-1], capsys)[0]  # with code edits: offloads that cost host RAM
    assert "costs " in out and not re.search(r"saves -", out)


def test_a_sequence_past_the_models_positions_warns_in_plan_and_fit(tmp_path, capsys):
    argv = ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--tuning", "lora", "--micro-batch", "1",
            "--seq", "200000", "--top", "1"]
    out = " ".join(run(argv, capsys)[0].split())
    assert "warning: sequence of 200,000 tokens is beyond the model's max_position_embeddings (131,072)" in out
    assert json.loads(run(argv + ["--json"], capsys)[0])["warnings"][0].startswith("sequence of 200,000 tokens")
    long = tmp_path / LLAMA_YAML.name
    shutil.copy(LLAMA_YAML, long)
    long.write_text(long.read_text().replace("cutoff_len: 2048", "cutoff_len: 200000"))
    out = run(["fit", str(long), "--gpu-mem", "4TiB", "--gpus", "1", "--out", str(tmp_path / "out")], capsys)[0]
    warnings = [line for line in out.splitlines() if "beyond the model's max_position_embeddings" in line]
    assert len(warnings) == 1 and warnings[0].startswith("  warning: sequence of 200,000 tokens")
    assert "fits" in out.splitlines()[0]  # the answer stays first


def test_the_padded_fill_is_in_the_json_beside_the_ranking_it_moves(capsys):
    doc = json.loads(run(QWEN + ["--json"], capsys)[0])
    fill = doc["padded_fill"]
    assert fill["fill"] == assumptions()["data"]["padded_fill"] and fill["source"] == "data/speed.toml padded_fill"
    assert fill["runs"][0] == "start" and set(fill["runs"][1:]) <= set(range(1, len(doc["rows"]) + 1))
    one = QWEN[:QWEN.index("--micro-batch")] + ["--micro-batch", "1"] + QWEN[QWEN.index("--micro-batch") + 2:]
    assert json.loads(run(one + ["--json"], capsys)[0])["padded_fill"] is None  # nothing padded: nothing named
