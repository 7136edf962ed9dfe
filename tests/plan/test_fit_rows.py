"""Issue 30: `memfit fit FILE --row N` writes plan N of those `memfit plan --from FILE` shows, or says in one line
which setting that file's format cannot hold. For every example file of every format memfit reads and writes, each
shown row is written and read back (`memfit estimate --from` the written file: the row's device total and verdict,
byte for byte, with a code edit's knobs given as flags), or refused in one line naming the knob."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from memfit.facts.knobs import axes, knobs
from memfit.interfaces.cli.main import main
from memfit.interfaces.cli.next_steps import flags_for

HERE = Path(__file__).resolve().parents[1] / "formats"
sys.path.insert(0, str(HERE))
from format_cases import CASES, EXAMPLES  # noqa: E402

GPU = ["--gpu", "a100-40gb"]  # small enough that most examples need changes, large enough that several plans fit
NO_MODEL = ["meta-llama/Llama-3.1-8B-Instruct"]  # for files that name none (DeepSpeed JSON, accelerate)
FILES = {name: ["--gpus", str(o["gpus"])] if "gpus" in o else [] for name, (o, _) in CASES.items()}
FILES |= {"../axolotl_examples/lora-1b.yml": [], "../llamafactory_v1_examples/freeze_sft.yaml": []}


def _call(capsys, argv) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _plan(capsys, path: str, extra: list[str]) -> tuple[list[str], dict]:
    rc, out, err = _call(capsys, ["plan", "--from", path, *GPU, *extra, "--json"])
    model = []
    if rc and "say which model" in err:
        model = NO_MODEL
        rc, out, err = _call(capsys, ["plan", *model, "--from", path, *GPU, *extra, "--json"])
    assert rc == 0, err
    return model, json.loads(out)


def _edited_flags(capsys, path, model, extra, n) -> list[str]:
    """The knobs of plan n that need a code edit (no key in the file), as estimate flags."""
    from memfit.interfaces.cli.args import scenario_and_file
    from memfit.interfaces.cli.main import build_parser
    from memfit.interfaces.formats import knobs_from_scenario
    from memfit.planner.plan import Options, search_plans

    a = build_parser().parse_args(["estimate", *model, "--from", path, *GPU, *extra])
    row = search_plans(scenario_and_file(a)[0], set(), None, top_k=max(5, n), options=Options()).rows[n - 1]
    values = knobs_from_scenario(row.scenario)
    return list(flags_for({k: values[k] for c in row.changes if c.code_edit for k in axes()[c.knob]}))


@pytest.mark.parametrize("name", sorted(FILES))
def test_fit_writes_each_row_plan_shows_or_names_the_knob_the_file_cannot_hold(name, tmp_path, monkeypatch, capsys):
    extra = FILES[name]
    path = str((EXAMPLES / name).resolve())
    model, doc = _plan(capsys, path, extra)
    monkeypatch.chdir(EXAMPLES / "llamafactory")  # the launch folder: a YAML names examples/deepspeed/*.json from here
    for n, row in enumerate(doc["rows"], 1):
        out_dir = tmp_path / f"row{n}"
        fit_model = ["--model", model[0]] if model else []
        rc, out, err = _call(capsys, ["fit", path, *GPU, *extra, *fit_model, "--row", str(n), "--out", str(out_dir)])
        if rc:
            assert rc == 2 and len(err.strip().splitlines()) == 1, err
            said = re.search(r"cannot (?:write|say) ([a-z_0-9]+)=", err)
            assert said and said.group(1) in knobs(), err  # names the knob the format lacks
            assert not out_dir.exists()  # nothing written
            continue
        if not row["changes"]:
            assert "no change to write" in out
            continue
        written = out_dir / Path(path).name
        flags = _edited_flags(capsys, path, model, extra, n)
        assert ("NEEDS A CODE EDIT" in out) == bool(flags)
        rc, again, err = _call(capsys, ["estimate", *model, "--from", str(written), *GPU, *extra, *flags, "--json"])
        assert rc == 0, err
        got = json.loads(again)
        assert got["verdict"] == row["verdict"], (n, out)
        assert got["per_rank"]["device_total"]["peak_bytes"] == row["device_peak_bytes"], (n, out)
        shutil.rmtree(out_dir)


def test_a_row_past_the_shown_ones_is_one_line_with_the_range(capsys):
    path = str(EXAMPLES / "llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml")
    _, doc = _plan(capsys, path, ["--gpus", "7"])
    n = len(doc["rows"])
    rc, _, err = _call(capsys, ["fit", path, *GPU, "--gpus", "7", "--row", str(n + 4)])
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"shows {n} plan(s)" in err and f"choose 1 to {n}" in err


def test_fit_names_a_knob_the_written_file_reads_back_otherwise(tmp_path, capsys):
    """Adding DeepSpeed to a bf16 HF config: DeepSpeed's bf16 keeps fp32 master weights, so the written file reads
    back as bf16-mixed though the plan said bf16-pure; fit says so beside its numbers."""
    path = str(EXAMPLES / "hf/sft_config.yaml")
    rc, out, err = _call(capsys, ["fit", path, *GPU, "--out", str(tmp_path / "out")])
    assert rc == 0, err
    notes = [line for line in out.splitlines() if line.startswith("  note: hf cannot say")]
    assert len(notes) == 1 and "precision='bf16-pure'" in notes[0] and "precision='bf16-mixed'" in notes[0]


def test_fit_ends_with_a_next_step_that_runs(tmp_path, capsys, monkeypatch):
    import shlex

    monkeypatch.chdir(tmp_path)
    path = str(EXAMPLES / "llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml")
    rc, out, err = _call(capsys, ["fit", path, "--gpu", "rtx4090", "--gpus", "7", "--out", "out"])
    assert rc == 0, err
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("next: launch it; its whole estimate: memfit estimate ")
    rc, again, err = _call(capsys, [*shlex.split(last.split(": memfit ", 1)[1]), "--json"])
    assert rc == 0, err
    assert json.loads(again)["verdict"] == out.split(" -> ", 1)[1].split(" ")[0]  # the verdict fit promised
    rc, out, err = _call(capsys, ["fit", path, "--gpu", "a100-40gb", "--gpus", "7"])  # fits: nothing written
    last = out.rstrip().splitlines()[-1]
    assert rc == 0 and last.startswith("next: launch it as it is; faster plans that fit: memfit plan ")
    rc, _, err = _call(capsys, [*shlex.split(last.split(": memfit ", 1)[1]), "--top", "1", "--json"])
    assert rc == 0, err
