"""`memfit watch`: bad input is one line and exit 2; the JSON document; --follow on a growing file; the
detectors on figures a CPU run cannot produce (CUDA's reserved memory)."""
import json
import threading
import time
from pathlib import Path

import pytest

from memfit.facts.run_findings import finding, thresholds
from memfit.monitor import SCHEMA

GiB = 2**30


def line(step, rank=0, **kw):
    d = {"schema": SCHEMA, "rank": rank, "world_size": 1, "step": step, "time": 1.0, "step_seconds": 0.5,
         "tokens": 100, "device_kind": "cuda", "allocated_bytes": 10 * GiB, "reserved_bytes": 12 * GiB,
         "peak_allocated_bytes": 11 * GiB, "device_total_bytes": 80 * GiB, "host_rss_bytes": GiB}
    return json.dumps({**d, **kw}) + "\n"


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    ("{oops\n", "run.jsonl:1: not a JSON line"),
    (line(1) + "[1, 2]\n", "run.jsonl:2: schema 'list'"),
    (json.dumps({"schema": "memfit.doctor/1"}) + "\n", "schema 'memfit.doctor/1', expected 'memfit.monitor/1'"),
    (line(-1), "step must be a whole number"),
    (line(1, allocated_bytes="10GB"), "allocated_bytes must be a number"),
    (line(1).replace('"tokens": 100', '"tokens": Infinity'), "tokens must be a number"),
    ("", "no memfit.monitor/1 lines"),
    (line(1)[:40], "no memfit.monitor/1 lines"),  # only a partial line: nothing complete yet
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, watch, content, says):
    path = tmp_path / "run.jsonl"
    if content is not None:
        write(path, content)
    code, out, err = watch(path)
    assert code == 2 and out == ""
    assert err.startswith("memfit: error: ") and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("args, says", [(("--capacity", "lots"), "--capacity 'lots' is not a size"),
                                        (("--gpu", "nosuchgpu"), "unknown GPU"),
                                        (("--until-steps", "3"), "--until-steps goes with --follow")])
def test_bad_options_are_one_line(tmp_path, watch, args, says):
    code, _, err = watch(write(tmp_path / "run.jsonl", line(1)), *args)
    assert code == 2 and says in err and err.count("\n") == 1


def test_a_partial_last_line_is_skipped_and_the_json_document(tmp_path, watch_json):
    steps = "".join(line(s, allocated_bytes=10 * GiB + s * 2**20, peak_allocated_bytes=11 * GiB + s * 2**20)
                    for s in range(1, 41))
    doc = watch_json(write(tmp_path / "run.jsonl", steps + line(41)[:30]), "--gpu", "a100-80gb")
    assert set(doc) == {"schema", "steps", "ranks", "leak", "imbalance", "fragmentation", "findings", "vs_estimate"}
    assert doc["vs_estimate"] is None  # no --estimate-from
    assert doc["schema"] == "memfit.watch/1" and doc["steps"] == 40
    assert doc["ranks"]["0"]["steps"] == 40 and doc["ranks"]["0"]["last_step"] == 40
    g, = doc["findings"]
    assert g["kind"] == "growth" and g["bytes_per_step"] == pytest.approx(2**20)
    assert g["warmup_steps"] == thresholds()["growth_warmup_steps"]
    # 1 MiB a step from 11 GiB + 40 MiB at step 40 reaches the catalog A100's memory this many steps later
    assert g["steps_to_capacity"] == -(-(g["capacity_bytes"] - (11 * GiB + 40 * 2**20)) // 2**20)
    assert doc["leak"] == {"detected": True, "bytes_per_step": g["bytes_per_step"], "rank": 0,
                           "steps_to_capacity": g["steps_to_capacity"]}
    assert doc["imbalance"] == {"detected": False} and doc["fragmentation"] == {"detected": False}


def test_fragmentation_and_no_false_alarm(tmp_path, watch_json):
    frag = watch_json(write(tmp_path / "f.jsonl", "".join(line(s, reserved_bytes=20 * GiB) for s in range(1, 9))))
    f, = frag["findings"]
    assert f["kind"] == "fragmentation" and f["slack_bytes"] == 9 * GiB and f["share"] == pytest.approx(9 / 11, 1e-3)
    assert f["knobs"] == finding("fragmentation")["knobs"] and "expandable_segments:True" in f["knobs"][0]
    calm = watch_json(write(tmp_path / "c.jsonl", "".join(line(s) for s in range(1, 9))))
    assert calm["findings"] == []


def test_a_peak_read_as_zero_falls_back_to_what_was_allocated(tmp_path, watch_json):
    # a monitor line written just after torch.cuda.reset_peak_memory_stats: the allocated figure is the one to use
    doc = watch_json(write(tmp_path / "z.jsonl", "".join(line(s, reserved_bytes=20 * GiB, peak_allocated_bytes=0)
                                                         for s in range(1, 9))))
    f, = doc["findings"]
    assert f["kind"] == "fragmentation" and f["peak_allocated_bytes"] == 10 * GiB and f["slack_bytes"] == 10 * GiB


def test_follow_reads_a_growing_file_until_the_step(tmp_path, watch):
    path = write(tmp_path / "run.jsonl", line(1))

    def writer():
        for s in range(2, 6):
            time.sleep(0.05)
            with path.open("a") as f:
                text = line(s)
                f.write(text[:20])  # a line half-written when watch may read it
                f.flush()
                time.sleep(0.02)
                f.write(text[20:])

    t = threading.Thread(target=writer)
    t.start()
    code, out, err = watch(path, "--follow", "--until-steps", "5", "--interval", "0.01", "--json")
    t.join()
    docs = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and err == ""
    assert docs[-1]["ranks"]["0"]["last_step"] == 5 and len(docs) >= 2
    assert [d["ranks"]["0"]["last_step"] for d in docs] == sorted(d["ranks"]["0"]["last_step"] for d in docs)


def test_the_text_report_names_causes_and_knobs(tmp_path, watch):
    code, out, _ = watch(write(tmp_path / "f.jsonl", "".join(line(s, reserved_bytes=20 * GiB) for s in range(1, 9))))
    assert code == 0 and "fragmentation on rank 0" in out and "expandable_segments:True" in out


LF_LORA = Path(__file__).resolve().parents[1] / "formats/examples/llamafactory/examples/train_lora/llama3_lora_sft.yaml"


def _cuda_run(tmp_path, peak: int, used: int) -> Path:
    for rank in range(2):
        lines = [{"schema": "memfit.monitor/1", "rank": rank, "world_size": 2, "step": s, "time": float(s),
                  "step_seconds": 1.0, "tokens": 2048, "device_kind": "cuda", "allocated_bytes": peak // 2,
                  "reserved_bytes": peak, "peak_allocated_bytes": peak - rank, "device_used_bytes": used,
                  "device_total_bytes": 80 * GiB, "host_rss_bytes": 8 * GiB} for s in range(1, 6)]
        (tmp_path / f"run.rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path / "run.jsonl"


def test_the_measured_peak_beside_memfits_estimate(tmp_path, watch_json, capsys):
    """issue 13 item 3: --estimate-from puts the run's peak beside memfit's estimate of the same run (2 ranks,
    the GPU from the lines' device total); a run that held more than the estimate is flagged under-predicted."""
    from memfit.interfaces.cli.main import main

    assert main(["estimate", "--from", str(LF_LORA), "--gpu-mem", "80GiB", "--gpus", "2", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["per_rank"]
    allocated, total = est["allocated"]["peak_bytes"], est["device_total"]["peak_bytes"]
    over = watch_json(_cuda_run(tmp_path, int(allocated * 1.25), total), "--estimate-from", str(LF_LORA))["vs_estimate"]
    assert over["available"] and over["allocated"]["under_predicted"] is True
    assert over["allocated"]["error_pct"] == pytest.approx(100 * (1 / 1.25 - 1), abs=0.05)
    assert over["device_total"] == {"estimate_bytes": total, "measured_bytes": total, "error_pct": 0.0,
                                    "under_predicted": False}


def test_a_cpu_run_says_why_it_has_no_comparison(tmp_path, watch_json):
    run = write(tmp_path / "cpu.jsonl", "".join(line(s, device_kind="cpu", reserved_bytes=None, peak_allocated_bytes=None,
                                                    host_peak_rss_bytes=2 * GiB) for s in range(1, 4)))
    doc = watch_json(run, "--estimate-from", str(LF_LORA), "--gpu", "a100-80gb")
    assert doc["vs_estimate"]["available"] is False and "CPU" in doc["vs_estimate"]["why"]


def test_estimate_from_without_a_gpu_is_one_line(tmp_path, watch):
    """The lines say no device total and --gpu is not given: nothing to estimate on, said in one line."""
    run = write(tmp_path / "run.jsonl", "".join(line(s, device_total_bytes=None) for s in range(1, 4)))
    code, out, err = watch(run, "--estimate-from", str(LF_LORA), "--json")
    assert code == 2 and out == "" and err.count("\n") == 1 and "--gpu" in err
