"""--lengths files and options: the formats read, bad files as one line naming file and line, and what the
padding knob and preference pairs do to the predicted steps."""
import json

import pytest

from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.lengths.read import read_lengths

BASE = ["estimate", "qwen2-7b-instruct", "--gpu", "a100-80gb", "--gpus", "2", "--micro-batch", "2", "--seq", "4096",
        "--tuning", "lora", "--ckpt"]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_formats_read_the_same_lengths(tmp_path):
    plain = read_lengths(_write(tmp_path, "a.txt", "10 20\n30\n"))
    listed = read_lengths(_write(tmp_path, "b.json", "[10, 20, 30]"))
    rows = read_lengths(_write(tmp_path, "c.jsonl", '{"length": 10}\n{"input_ids": [1,2,3,4,5,6,7,8,9,10,'
                                                    '11,12,13,14,15,16,17,18,19,20]}\n\n{"length": 30}\n'))
    assert plain.tokens == listed.tokens == rows.tokens == (10, 20, 30)
    pairs = read_lengths(_write(tmp_path, "d.jsonl", '{"chosen_length": 7, "rejected_length": 9}\n'
                                                     '{"chosen_input_ids": [1, 2], "rejected_input_ids": [1]}\n'))
    assert pairs.pairs and pairs.tokens == (9, 2)


@pytest.mark.parametrize("name,text,where", [
    ("a.txt", "10\n20\nabc\n", "a.txt:3:"),
    ("b.txt", "10\n0\n", "b.txt:2:"),
    ("c.json", "[10,\n 2.5]", "c.json:"),
    ("d.jsonl", '{"length": 4}\n{"length": 4\n', "d.jsonl:2:"),
    ("e.jsonl", '{"length": 4}\n{"text": "hello"}\n', "d.jsonl:2:".replace("d", "e")),
    ("f.jsonl", '{"chosen_length": 4}\n', "f.jsonl:1:"),
    ("g.txt", "\n\n", "g.txt: no token lengths"),
])
def test_a_bad_file_is_one_line_naming_file_and_line(tmp_path, capsys, name, text, where):
    path = _write(tmp_path, name, text)
    with pytest.raises(MemfitError, match=None) as e:
        read_lengths(path)
    assert where in str(e.value) and "\n" not in str(e.value)
    assert main([*BASE, "--lengths", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit: error: ") and where in err and err.count("\n") == 1


def test_loader_options_without_lengths_are_refused(capsys):
    assert main([*BASE, "--seed", "3", "--drop-last"]) == 2
    assert "--seed, --drop-last" in capsys.readouterr().err


def _doc(capsys, *args) -> dict:
    assert main([*BASE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["lengths"]


def test_a_long_sample_makes_the_worst_step_and_the_imbalance(tmp_path, capsys):
    pytest.importorskip("torch", reason="torch is not installed: the exact order is torch.randperm's")
    lengths = [200] * 63 + [4000]
    doc = _doc(capsys, "--lengths", _write(tmp_path, "l.txt", "\n".join(map(str, lengths))))
    assert doc["steps"] == 16 and doc["ranks"] == 2 and doc["order"].startswith("exact (torch.randperm, seed 42)")
    w = doc["worst"]
    assert (w["seq_len"], w["tokens"]) == (4000, 8000)
    ranks = doc["per_rank"]
    assert ranks[w["rank"]]["max_peak_bytes"] == w["peak_bytes"] > ranks[1 - w["rank"]]["max_peak_bytes"]
    assert doc["imbalance"]["at_step"] == w["step"] and doc["imbalance"]["max_step_ratio"] > 1
    assert doc["imbalance"]["max_step_tokens_ratio"] == 20.0
    assert sum(h["count"] for h in doc["histogram"]) == 32


def test_first_oom_is_the_first_step_over_the_card(tmp_path, capsys):
    lengths = [100] * 40 + [4096] * 2 + [100] * 40
    doc = _doc(capsys, "--lengths", _write(tmp_path, "l.txt", "\n".join(map(str, lengths))), "--gpu-mem", "18GiB")
    first = doc["first_oom"]
    assert first is not None and first["seq_len"] == 4096 and first["verdict"] == "oom"
    assert first["step"] == min(c["step"] for c in [first, doc["worst"]])
    assert doc["worst"]["peak_bytes"] > 18 * 2**30


def test_packing_makes_every_step_full(tmp_path, capsys):
    path = _write(tmp_path, "l.txt", "\n".join(["300"] * 200 + ["3000"] * 3))
    doc = _doc(capsys, "--lengths", path, "--padding", "packed")
    assert doc["worst"]["seq_len"] == 4096 and len(doc["histogram"]) == 1
    assert doc["steps"] == -(-(-(-(200 * 300 + 9000) // 4096)) // 4)  # full rows over 2 ranks x 2 rows


def test_dpo_pairs_run_two_rows_padded_to_the_longer(tmp_path, capsys):
    rows = [{"chosen_length": 100, "rejected_length": 300}] * 7 + [{"chosen_length": 900, "rejected_length": 50}]
    path = _write(tmp_path, "p.jsonl", "\n".join(json.dumps(r) for r in rows))
    doc = _doc(capsys, "--lengths", path, "--method", "dpo")
    assert (doc["worst"]["seq_len"], doc["worst"]["tokens"]) == (900, 2 * 2 * 900)


def test_the_table_output_adds_the_lines(tmp_path, capsys):
    path = _write(tmp_path, "l.txt", "\n".join(["100"] * 30 + ["3000"]))
    assert main([*BASE, "--lengths", path, "--group-by-length"]) == 0
    out = capsys.readouterr().out
    assert "data lengths" in out and "worst step 1" in out and "assumed random" in out


def test_without_torch_the_order_is_assumed_and_other_orders_are_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` raises ImportError
    path = _write(tmp_path, "l.txt", "\n".join(["100"] * 40 + ["3000"]))
    doc = _doc(capsys, "--lengths", path)
    assert doc["order"] == "assumed random (torch is not importable)"
    assert doc["other_orders"]["orders"] == 4 and len(doc["other_orders"]["worst_peak_bytes"]) == 4
    assert doc["worst"]["seq_len"] == 3000  # the long sample lands somewhere in every order
