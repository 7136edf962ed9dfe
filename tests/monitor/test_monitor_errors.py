"""The monitor never breaks the training it watches; its own errors are counted, told once, then it stops."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[monitor])")

from memfit.monitor import MemoryMonitor, probes, rank_path  # noqa: E402
from monitor_loop import train  # noqa: E402


def test_an_unwritable_path_leaves_the_loop_running_and_is_reported_once(tmp_path, capsys):
    mon = train(str(tmp_path / "no" / "such" / "dir" / "run.jsonl"), None, 5, 16, "none")
    err = capsys.readouterr().err
    assert err.count("memfit monitor:") == 1 and "No such file" in err
    assert mon.disabled and mon.errors == 1 and mon.lines == 0


def test_an_error_mid_run_is_contained_and_the_lines_before_it_stay(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.jsonl"
    done = 0
    with MemoryMonitor(path) as mon:
        for step in range(6):
            if step == 3:  # the host reader breaks (as /proc could on another OS) from the 4th step on
                monkeypatch.setattr(probes.HostReader, "rss", lambda self: 1 / 0)
            torch.ones(4).sum()
            mon.step(tokens=4)
            done += 1
    assert done == 6 and mon.errors == 1 and mon.disabled
    assert capsys.readouterr().err.count("ZeroDivisionError") == 1
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]


def test_the_training_loops_own_exception_goes_on_up(tmp_path):
    try:
        with MemoryMonitor(tmp_path / "run.jsonl") as mon:
            mon.step()
            raise KeyError("the loop's")
    except KeyError:
        pass
    else:
        raise AssertionError("the monitor swallowed the loop's exception")
    assert mon.errors == 0


def test_each_rank_writes_its_own_file():
    assert rank_path("run.jsonl", 3, 8) == "run.rank3.jsonl"
    assert rank_path("out/{rank}/run.jsonl", 3, 8) == "out/3/run.jsonl"
    assert rank_path("run.jsonl", 0, 1) == "run.jsonl"


def test_rank_and_world_size_come_from_the_launchers_environment(tmp_path):
    code = ("import torch; from memfit.monitor import MemoryMonitor\n"
            "with MemoryMonitor('run.jsonl') as m: m.step(tokens=7)\n")
    env = {**os.environ, "RANK": "2", "WORLD_SIZE": "4"}
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
    line = json.loads((tmp_path / "run.rank2.jsonl").read_text())
    assert (line["rank"], line["world_size"], line["tokens"], line["device_kind"]) == (2, 4, 7, "cpu")
    assert line["allocated_bytes"] > 0 and line["host_rss_bytes"] > 0 and line["reserved_bytes"] is None


def test_importing_the_monitor_needs_no_torch():
    code = "import sys, memfit.monitor; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cpu_peaks_per_step_or_since_start(tmp_path):
    peaks = {}
    for per_step in (True, False):
        path = tmp_path / f"{per_step}.jsonl"
        with MemoryMonitor(path, cpu_step_peaks=per_step) as mon:
            for step in range(3):
                if step == 1:
                    big = torch.ones(50 * 2**20)  # 200 MiB touched, then freed within the step
                    del big
                mon.step()
        peaks[per_step] = [json.loads(x)["host_peak_rss_bytes"] for x in path.read_text().splitlines()]
    each, since_start = peaks[True], peaks[False]
    assert each[1] - each[2] > 150 * 2**20  # the third step's own peak is without the 200 MiB
    assert since_start[2] >= since_start[1] >= since_start[0]
