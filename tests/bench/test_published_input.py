"""bench/published.py (and bench/peers.py, which reads cases through it) takes any case file the schema allows:
lists or strings where a key may be either, null anywhere, numbers written as strings, units in any case. A row
it cannot read is a skipped row with the reason, never an exception."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import published  # noqa: E402
from shared_cases import PUBLISHED  # noqa: E402
from shared_support import shared  # noqa: E402

CASES = PUBLISHED
REAL = [json.loads(line) for line in shared(CASES).read_text().splitlines() if line.strip()]


def _sample() -> list[dict]:
    """One real row per kind of run (engine x method x basis) that memfit estimates, so every code path of
    scenario_for and evaluate meets the mutations."""
    seen, out = set(), []
    for case in (c for c in REAL if not published.evaluate(c).skip):
        kind = (case["distributed"].split()[0].lower(), case["method"].split()[0].lower(), case["basis"])
        if kind not in seen:
            seen.add(kind)
            out.append(case)
    return out[:10]


SAMPLE = _sample()
GOOD = SAMPLE[0]
# every value a key may be given as by a source that writes the schema loosely, or wrongly
MUTATIONS = {
    "null": lambda v: None,
    "list": lambda v: [v],
    "string": lambda v: str(v),
    "object": lambda v: {"value": v},
    "number": lambda v: 3.5,
    "word": lambda v: "abc",
    "nested": lambda v: [[v]],
}


def _outcome(row: published.Row) -> tuple:
    return row.skip, row.predicted, row.measured, row.predicted_label


def test_lora_targets_as_a_list_or_as_text():
    assert published._lora_targets({"lora_targets": ["q_proj", "v_proj"]}) == ("q_proj", "v_proj")
    assert published._lora_targets({"lora_targets": "q,v,output_proj + MLP"}) == (
        "q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert published._lora_targets({"lora_targets": ["all-linear"]}) is None


def test_sample_covers_lora_and_sharded_runs():
    kinds = {(c["distributed"].split()[0].lower(), c["method"].split()[0].lower()) for c in SAMPLE}
    assert len(SAMPLE) >= 5 and any(m == "lora" for _, m in kinds) and any(d != "single" for d, _ in kinds)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_every_key_mutated_gives_a_row_or_a_skip_with_a_reason(mutation):
    change = MUTATIONS[mutation]
    for case in SAMPLE:
        for key in case:
            row = published.evaluate({**case, key: change(case[key])})  # raises nothing: that is the test
            assert isinstance(row, published.Row), (case["id"], key)
            assert row.skip or row.predicted_label in ("fits", "oom", "host_oom"), (case["id"], key, mutation)
            assert row.skip is None or (isinstance(row.skip, str) and row.skip.strip()), (case["id"], key)
    assert published.summarize([published.evaluate({**c, k: change(c[k])}) for c in SAMPLE[:2] for k in c])


def test_a_lora_case_reads_the_same_with_its_targets_as_a_json_list():
    """Issue 14: bench/published.py crashed with a traceback on a case whose lora_targets is a JSON list."""
    cases = [c for c in REAL if c["lora_targets"] and published._lora_targets(c) and not published.evaluate(c).skip]
    assert cases
    for case in cases[:5]:
        as_list = case["lora_targets"].replace(",", " ").split()
        row = published.evaluate({**case, "lora_targets": as_list})
        assert row.skip is None
        assert _outcome(row) == _outcome(published.evaluate(case))


@pytest.mark.parametrize("key", published.COUNT_KEYS + published.NUMBER_KEYS)
def test_numbers_written_as_strings_read_as_the_numbers(key):
    cases = [c for c in REAL if isinstance(c.get(key), (int, float))][:3]
    for case in cases:
        assert _outcome(published.evaluate({**case, key: f" {case[key]} "})) == _outcome(published.evaluate(case))


def test_units_in_any_case_and_flags_as_words():
    case = next(c for c in REAL if c["measured_unit"] == "GiB" and c["measured_value"] and c["compile"] is False)
    base = _outcome(published.evaluate(case))
    assert base[0] is None
    for unit in ("gib", "GIB", " GiB"):
        assert _outcome(published.evaluate({**case, "measured_unit": unit})) == base
    assert _outcome(published.evaluate({**case, "compile": "false"})) == base
    mib = published.evaluate({**case, "measured_unit": "MiB", "measured_value": case["measured_value"] * 1024})
    assert mib.measured == pytest.approx(published.evaluate(case).measured)


def test_a_file_with_broken_lines_gives_skipped_rows(tmp_path, capsys, monkeypatch):
    path = tmp_path / "cases.jsonl"
    lines = [json.dumps(GOOD), "{not json", "[1, 2]", "null", json.dumps({"id": 7}), '"text"',
             json.dumps({**GOOD, "id": None, "model": ["a", "b"]})]
    path.write_text("\n".join(lines) + "\n\n")
    rows = [published.evaluate(c) for c in published.read_cases(path)]
    assert len(rows) == len(lines)
    assert rows[0].skip is None
    assert all(r.skip for r in rows[1:])
    assert "line 2 is not JSON" in rows[1].skip and rows[1].case["id"] == "(line 2)"
    assert "no model" in rows[4].skip and rows[4].case["id"] == "7"
    monkeypatch.setattr(sys, "argv", ["published.py", "--cases", str(path), "--summary-json"])
    assert published.main() == 0
    assert json.loads(capsys.readouterr().out)["n_skipped"] == len(lines) - 1


def test_peers_reads_the_same_broken_file(tmp_path):
    import peers

    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), "{not json", json.dumps({**GOOD, "seq_len": [1, 2]})]))
    _, skipped = peers.published_rows(path)
    assert [i for i, _ in skipped] == ["(line 2)", GOOD["id"]]
    assert "seq_len" in skipped[1][1]


def test_fms_rows_are_estimated_as_the_transformers_and_foak_loss_they_ran():
    """fms-acceleration's refs ran transformers 4.48.1; FOAK's fast loss is an in-place cross entropy for the
    Llama family there, and reaches GPTBigCode's too: 4.48.1's GPTBigCodeForCausalLM still calls the
    CrossEntropyLoss name FOAK swaps (self.loss_function only from 4.48.3), whose 16-bit loss is that release's own
    measured row (data/loss_tail.toml 4.48.1, covering 4.48.0 .. 4.48.3)."""
    from memfit.facts.loss_tail import measured_release

    by_id = {c["id"]: c for c in REAL}
    foak = [c for c in REAL if c["id"].startswith("fms-") and "foak" in (c.get("kernels") or "").lower()]
    llama = published.scenario_for(next(c for c in foak if "Mistral-7B" in c["model"]))
    bigcode = published.scenario_for(next(c for c in foak if "santacoder" in c["model"]))
    assert dict(llama.releases) == dict(bigcode.releases) == {"transformers": published.FMS_TRANSFORMERS}
    assert (llama.loss, bigcode.loss) == ("inplace_ce", "inplace_ce")
    assert measured_release(published.FMS_TRANSFORMERS) == "4.48.1" and measured_release("4.48.3") == "4.48.3"
    assert not bigcode.bnb_saves_input  # the refs' bitsandbytes 0.43.3 keeps no input for backward
    plain = next(c for c in REAL if c["id"].startswith("fms-") and not c.get("kernels"))
    assert published.scenario_for(by_id[plain["id"]]).loss == "standard"


def test_torchtune_rows_run_the_torchtune_their_source_dates():
    """The README table of torchtune PR #955 (May 2024) ran main between v0.1.1 and v0.2.0: fp32 logits under
    nn.CrossEntropyLoss, LoRA on q_proj and v_proj (data/releases.toml); rows no source dates keep the pins."""
    lora = published.scenario_for(next(c for c in REAL if c["id"] == "torchtune-readme-2024-05-1"))
    assert dict(lora.releases) == {"torchtune": published.TORCHTUNE_RUNS["torchtune-readme-2024-05-"]}
    assert (lora.loss, lora.lora_targets) == ("standard", ("q", "v"))
    assert published._versions({"id": "torchtune-someone-else"}) is None
