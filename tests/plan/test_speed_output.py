"""The speed half of the answer: `memfit estimate` prints and --json carries {"tokens_per_s", "step_s", "band"}
(and the whole run's wall-clock and cost given its size); plan rows say when their speeds tie; the throughput
bench and the CPU-optimizer measurement print what they document."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.interfaces.cli.main import main
from memfit.planner.search import tie_groups
from memfit.planner.step_time import step_time
from memfit.planner.throughput import band, predict, tie_band

ROOT = Path(__file__).resolve().parents[2]
EST = ["estimate", "Qwen/Qwen2-0.5B-Instruct", "--gpu", "a100-80gb", "--seq", "1024", "--micro-batch", "4"]


def test_estimate_json_carries_the_speed_with_its_band(capsys):
    assert main([*EST, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    speed = doc["speed"]
    assert set(speed) == {"tokens_per_s", "step_s", "band"}
    b = band()
    assert speed["band"] == {"low": round(b.low, 3), "high": round(b.high, 3), "coverage": b.coverage}
    assert speed["band"]["low"] < 1 < speed["band"]["high"]
    st = step_time(_scenario())
    assert speed["tokens_per_s"] == pytest.approx(st.tokens_per_step / speed["step_s"], rel=1e-3)
    assert doc["verdict"] == "fits"  # the memory answer is unchanged beside it


def test_estimate_prints_speed_after_the_verdict_and_prices_the_run(capsys):
    assert main([*EST, "--tokens", "36000000", "--price-per-gpu-hour", "2.5"]) == 0
    out = capsys.readouterr().out
    verdict = out.index("FITS:")
    assert out.index("speed:") > verdict and out.index("run: 36,000,000 tokens") > verdict
    assert main([*EST, "--tokens", "36000000", "--price-per-gpu-hour", "2.5", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["speed"]["run"]
    _, tps, _ = predict(_scenario())
    assert run["seconds"] == pytest.approx(36e6 / tps, rel=1e-3)
    assert run["cost"] == pytest.approx(run["seconds"] / 3600 * 2.5, rel=1e-3)
    assert run["seconds_band"][0] < run["seconds"] < run["seconds_band"][1]


def test_estimate_counts_the_run_from_the_data_lengths(tmp_path, capsys):
    data = tmp_path / "lengths.json"
    data.write_text(json.dumps([100, 500, 3000]))  # 3000 is cut at --seq 1024
    assert main([*EST, "--lengths", str(data), "--epochs", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speed"]["run"]["tokens"] == (100 + 500 + 1024) * 3


def test_the_run_size_and_the_lengths_report_share_one_read_of_the_data(tmp_path):
    from memfit.interfaces.cli.main import build_parser
    from memfit.interfaces.cli.run_cost import speed_section
    from memfit.interfaces.lengths.cli import lengths_report
    from memfit.interfaces.lengths.read import read_lengths

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"chosen_length": 100, "rejected_length": 300}\n{"chosen_length": 2000, "rejected_length": 50}\n')
    for method, rows in (("dpo", 2), ("sft", 1)):  # DPO trains both rows of a pair; SFT one row of the longer
        a = build_parser().parse_args([*EST, "--method", method, "--lengths", str(path), "--epochs", "2"])
        s = _scenario(a)
        data = read_lengths(str(path), s.model)
        moved = path.rename(tmp_path / "gone.jsonl")  # a second read of the data would now fail
        assert speed_section(a, s, data)["run"]["tokens"] == (300 + 1024) * rows * 2
        assert lengths_report(a, s, data).worst.tokens > 0
        moved.rename(path)


def test_a_price_without_the_run_size_is_one_clear_line(capsys):
    assert main([*EST, "--price-per-gpu-hour", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tokens" in err


def _scenario(a=None):
    from memfit.interfaces.cli.args import scenario_from_args
    from memfit.interfaces.cli.main import build_parser

    return scenario_from_args(a or build_parser().parse_args(EST))


def test_speeds_inside_the_tie_band_are_one_group():
    t = tie_band()
    assert 0 < t < 0.5
    speeds = [100.0, 100 * (1 - t / 2), 100 * (1 - 1.5 * t), 100 * (1 - 1.5 * t) * (1 - t / 3)]
    assert tie_groups(speeds) == [0, 0, 1, 1]


def test_plan_rows_that_tie_say_so_and_rank_fewer_changes_first(monkeypatch, capsys):
    args = ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--gpus", "2", "--tuning", "full",
            "--seq", "1024", "--allow", "lora,qlora", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    tied = [(i, r) for i, r in enumerate(rows, 1) if r["ties_with"]]
    assert tied  # LoRA with checkpointing and QLoRA without are inside the band on 2 x 4090
    for i, r in tied:
        for j in r["ties_with"]:
            other = rows[j - 1]
            assert i in other["ties_with"]
            slower, faster = sorted((r, other), key=lambda x: x["tokens_per_second"])
            assert slower["tokens_per_second"] >= faster["tokens_per_second"] * (1 - tie_band())
            if j > i:  # ranked first inside the tie: no more changes than the one below it
                assert len(r["changes"]) <= len(other["changes"])
    assert all("speed" in r and r["speed"]["tokens_per_s"] == r["tokens_per_second"] for r in rows)


def test_throughput_bench_runs_on_a_few_rows_and_prints_its_tables():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "throughput.py"), "--limit", "12"], check=True,
                         capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}).stdout
    assert "fms-acceleration" in out and "spearman" in out and "held-out rows" in out
    assert "trade-off" in out and "not judged: no row of throughput.jsonl runs it" in out
    doc = json.loads(subprocess.run([sys.executable, str(ROOT / "bench" / "throughput.py"), "--limit", "12",
                                     "--summary-json"], check=True, capture_output=True, text=True).stdout)
    fms = doc["per_source"]["fms-acceleration"]
    assert fms["rows"] == 12 and 0 < fms["p10"] <= fms["median"] <= fms["p90"]


def test_cpu_adam_measurement_prints_its_documented_record():
    pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[measure])")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "measure_cpu_adam.py"), "--params", "200000",
                          "--steps", "2", "--threads", "1"], check=True, capture_output=True, text=True).stdout
    doc = json.loads(out.splitlines()[-1])
    assert doc["schema"] == "memfit.cpu_optimizer/1" and doc["threads"] == 1 and doc["params"] == 200000
    assert {"torch", "python"} <= set(doc["versions"])
    for name in ("deepspeed_cpu_adam", "torch_adamw_single_tensor", "torch_adamw_foreach", "torch_adamw_fused"):
        result = doc["optimizers"][name]
        assert "error" in result or (result["params_per_second"] > 0 and result["step_seconds"] > 0
                                     and result["params_per_second_per_thread"] == result["params_per_second"])


def test_prompt_tuning_pays_for_its_virtual_tokens_and_boft_for_its_rotation(scenario):
    kw = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="a100-80gb", micro_batch=1, seq_len=512,
              lora_targets=("q", "v"))
    lora = step_time(scenario(**kw, tuning="lora"))
    prompt = step_time(scenario(**kw, tuning="prompt", virtual_tokens=128))
    boft = step_time(scenario(**kw, tuning="boft"))
    assert prompt.breakdown["matmul"] > lora.breakdown["matmul"] * 1.15  # 640 positions a row, 512 counted
    assert boft.tokens_per_second < lora.tokens_per_second / 2  # dense in x in factors rebuilt every forward
