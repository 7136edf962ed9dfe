"""--lengths against a real run (issue 13's done-when): two gloo ranks on the CPU, a DataLoader over torch's
DistributedSampler, a long-tailed (lognormal, a few long outliers) length distribution, rows padded to the longest
of each micro-batch, a tiny Llama built by transformers from a config.json under DDP, monitored per step.

Checked: the tokens of every step on every rank (as the monitor records them) are the predicted ones; the
predicted worst step and rank is the run's; and the per-step peaks. The CPU's peak is the process RSS high-water
mark, which holds the process's own memory (libraries, thread pools, gloo) beside the tensors the estimate
counts. That memory is this machine's, so it is learned the way a user learns theirs: `memfit calibrate` on
another monitored run of the same loop (uniform short rows, other data), and the estimate made with that profile
must then be within 5% of every steady step. The first two steps are warm-up (Adam's states appear in step 1;
the process settles through step 2) and the estimate is the steady state, so they are left out of the peak
comparison, not out of the token check."""
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from net_support import free_port

from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser, main
from memfit.interfaces.lengths.batches import Batching
from memfit.interfaces.lengths.predict import predict
from memfit.interfaces.lengths.read import read_lengths
from memfit.interfaces.runs.calibrate import calibrate, cpu_run_rss
from memfit.interfaces.runs.read import RunReader
from memfit.roles.estimate import estimate

HERE = Path(__file__).resolve().parent
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
              "vocab_size": 8000, "max_position_embeddings": 1024, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
MICRO, SEQ, SEED, WORLD, WARMUP = 4, 512, 42, 2, 2
KNOBS = ["--gpu", "a100-80gb", "--gpus", str(WORLD), "--engine", "ddp", "--precision", "fp32", "--optimizer",
         "adamw-loop", "--micro-batch", str(MICRO), "--seq", str(SEQ), "--attn", "sdpa", "--padding", "padded"]


def _lengths() -> list[int]:
    """Lognormal around 40 tokens, and six long outliers, one longer than --seq (cut to it)."""
    r = random.Random(5)
    out = [min(200, max(4, int(r.lognormvariate(3.6, 0.6)))) for _ in range(90)] + [700, 420, 400, 380, 350, 300]
    r.shuffle(out)
    return out


CALIBRATION_ROWS, CALIBRATION_LENGTH = 32, 64


def _train(folder: Path, lengths: str, out: str) -> None:
    port = free_port()
    # a fixed mmap threshold: freed tensors go back to the OS, so each step's RSS peak is that step's own
    env = os.environ | {"WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    procs = [subprocess.Popen([sys.executable, str(HERE / "lengths_loop.py"), str(folder / "tiny"),
                               str(folder / lengths), str(folder / out), str(MICRO), str(SEED), str(SEQ)],
                              env=env | {"RANK": str(r)}, stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lengths")
    (folder / "tiny").mkdir()
    (folder / "tiny" / "config.json").write_text(json.dumps(TINY_LLAMA))
    (folder / "lengths.txt").write_text("\n".join(map(str, _lengths())))
    (folder / "calibration.txt").write_text("\n".join([str(CALIBRATION_LENGTH)] * CALIBRATION_ROWS))
    _train(folder, "calibration.txt", "calibration.jsonl")
    _train(folder, "lengths.txt", "run.jsonl")
    measured = {}
    for r in range(WORLD):
        for line in (folder / f"run.rank{r}.jsonl").read_text().splitlines():
            d = json.loads(line)
            measured[(d["step"], r)] = (d["tokens"], d["host_peak_rss_bytes"])
    return folder, measured


def _predicted(folder: Path):
    s = scenario_from_args(build_parser().parse_args(["estimate", str(folder / "tiny"), *KNOBS]))
    report = predict(s, read_lengths(str(folder / "lengths.txt")), Batching(world=WORLD, micro_batch=MICRO, seed=SEED))
    return s, report


def test_every_step_and_rank_gets_the_predicted_tokens(run):
    folder, measured = run
    _, report = _predicted(folder)
    assert report.order == f"exact (torch.randperm, seed {SEED})"
    predicted = {(c.step, c.rank): c.tokens for row in report.cells for c in row}
    assert predicted == {k: v[0] for k, v in measured.items()}


def test_the_worst_step_and_rank_are_the_runs(run):
    folder, measured = run
    _, report = _predicted(folder)
    w = report.worst
    assert w.seq_len == SEQ and w.tokens == MICRO * SEQ  # the 700-token outlier, cut to --seq
    assert max(measured, key=lambda k: measured[k][1]) == (w.step, w.rank)


def _calibrated(folder: Path, s):
    """The scenario with this machine's runtime constants, measured by calibrate on the other run."""
    reader = RunReader([str(folder / "calibration.jsonl")])
    reader.poll()
    runtime = s.hardware.runtime
    c = calibrate(reader.by_rank(), estimate(s.with_changes(seq_len=CALIBRATION_LENGTH)), runtime)
    assert set(c.values) == {"process_host_baseline"}  # a CPU run shows no CUDA constant
    return replace(s, hardware=replace(s.hardware, runtime=runtime.with_values(c.values, "calibrated")))


def test_steady_per_step_peaks_within_5_percent(run):
    folder, measured = run
    s, report = _predicted(folder)
    s = _calibrated(folder, s)
    errors = []
    for row in report.cells:
        for c in row:
            if c.step > WARMUP:
                predicted = cpu_run_rss(estimate(s.with_changes(micro_batch=MICRO, seq_len=c.seq_len)))
                errors.append((round(100 * (predicted / measured[(c.step, c.rank)][1] - 1), 2), c.step, c.rank))
    print("per-step peak errors (%, step, rank):", sorted(errors))
    assert len(errors) >= 15 and max(abs(e) for e, _, _ in errors) < 5, errors


def test_the_cli_reports_the_same_worst_step(run, capsys):
    folder, _ = run
    assert main(["estimate", str(folder / "tiny"), *KNOBS, "--lengths", str(folder / "lengths.txt"),
                 "--sampler", "distributed", "--seed", str(SEED), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["lengths"]
    _, report = _predicted(folder)
    assert doc["worst"] == report.worst.to_json() | {"where": "exact"} and doc["steps"] == len(report.cells)
