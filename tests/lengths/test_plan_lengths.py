"""`memfit plan --lengths`: plans judged at the worst micro-batch of the data. The planner sees only the few
deciding shapes per micro-batch size; each plan row must agree with the full per-step, per-rank walk of
`estimate --lengths` (predict) for that row's own configuration, and the data must move the plan when it is
shorter than --seq."""
import json
from dataclasses import replace

import pytest

from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser, main
from memfit.interfaces.lengths.batches import Batching
from memfit.interfaces.lengths.plan import data_shapes
from memfit.interfaces.lengths.predict import predict
from memfit.interfaces.lengths.read import read_lengths
from memfit.planner.data import Batch, frontier
from memfit.planner.plan import baseline, plan
from memfit.planner.space import Options

ARGS = ["qwen2-7b-instruct", "--gpu", "a100-80gb", "--gpus", "2", "--micro-batch", "4", "--seq", "8192"]


def _data(tmp_path, lengths):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lengths)))
    return str(path)


def _base():
    return scenario_from_args(build_parser().parse_args(["plan", *ARGS]))


def test_frontier_keeps_only_shapes_no_other_beats():
    shapes = [Batch(4, 900, 1, 0, 3600, True), Batch(4, 3000, 7, 1, 12000, True), Batch(4, 3000, 9, 0, 12000, True),
              Batch(2, 2500, 12, 1, 5000, True), Batch(1, 5000, 12, 0, 5000, True)]
    assert frontier(shapes) == (shapes[1], shapes[4])  # first occurrence of 4 x 3000; 2 x 2500 is beaten


def test_every_row_is_judged_at_the_full_walks_worst_step(tmp_path):
    lengths = [300 + 37 * (i % 50) for i in range(400)] + [5000, 2600]
    data = read_lengths(_data(tmp_path, lengths))
    base = _base()
    b = Batching(world=2, micro_batch=4, grad_accum=1, sampler="accelerate")
    shapes = data_shapes(base, data, b, per_gpu=4)
    rows = plan(base, top_k=5, options=Options(data=shapes))
    assert rows
    for row in [*rows, baseline(base, options=Options(data=shapes))]:
        s = row.scenario
        full = predict(s, data, replace(b, micro_batch=s.micro_batch, grad_accum=s.grad_accum))
        decided = full.cells[row.decided_by.step - 1][row.decided_by.rank]  # the walk's cell at that step, rank
        assert row.device_peak_bytes == full.worst.peak_bytes == decided.peak_bytes  # no step of the walk is worse
        assert row.verdict == full.worst.verdict
        if row in rows:  # a plan fits at every step of the data, the start need not
            assert full.first("oom") is None and full.first("tight") is None


def test_short_data_lets_the_start_fit_where_seq_does_not(tmp_path, capsys):
    path = _data(tmp_path, [200 + i for i in range(300)])  # longest 499 tokens, --seq 8192
    lora = [*ARGS, "--tuning", "lora"]
    assert main(["plan", *lora, "--json"]) == 0
    by_seq = json.loads(capsys.readouterr().out)
    assert main(["plan", *lora, "--lengths", path, "--json"]) == 0
    by_data = json.loads(capsys.readouterr().out)
    assert by_seq["start"]["verdict"] == "oom" and by_data["start"]["verdict"] == "fits"
    assert by_data["rows"][0]["tokens_per_second"] >= by_data["start"]["tokens_per_second"]
    assert by_seq["rows"][0]["changes"] and by_seq["rows"][0]["tokens_per_second"] < \
        by_data["rows"][0]["tokens_per_second"]  # --seq needed changes that cost speed; the data does not
    assert by_data["start"]["decided_by"]["seq_len"] == 499 and by_data["lengths"] == path
    assert "decided_by" not in by_seq["start"] and "lengths" not in by_seq


def test_the_table_says_which_step_and_rank_decide(tmp_path, capsys):
    path = _data(tmp_path, [200] * 100 + [3000])
    assert main(["plan", *ARGS, "--lengths", path]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "judged at the data's worst micro-batch: step" in out and "x 3000 tokens" in out


@pytest.mark.parametrize("extra,words", [
    (["--max-seq"], "--max-seq / --max-batch search one knob"),
    (["--seed", "3"], "--seed describe the data loader of --lengths DATA"),
])
def test_plan_refuses_lengths_options_that_do_nothing(tmp_path, capsys, extra, words):
    lengths = [] if "--seed" in extra else ["--lengths", _data(tmp_path, [100, 200])]
    assert main(["plan", *ARGS, *lengths, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit: error: ") and words in err and err.count("\n") == 1
