"""`python -m memfit.trace.derive`: every derived table re-derived against the installed libraries in one
command, each moved fact named with its change."""
from __future__ import annotations

import pytest

from memfit.trace import derive

pytest.importorskip("torch")


def test_a_moved_number_is_named_with_its_relative_change_and_a_new_or_gone_key_is_said():
    old = 'torch = "2.13.0"\n[row]\nshare = 0.20\nkept = 1\nlist = [1, 2]\n'
    new = 'torch = "2.14.0"\n[row]\nshare = 0.25\nkept = 1\nlist = [1, 3]\nextra = true\n'
    lines = derive.moved(old, new)
    assert "  row.share: 0.2 -> 0.25 (+25.0%)" in lines
    assert "  torch: '2.13.0' -> '2.14.0'" in lines and "  row.list: [1, 2] -> [1, 3]" in lines
    assert "  row.extra: new, True" in lines and not any("kept" in x for x in lines)
    assert derive.moved(new, old)[0] == "  row.extra: True -> gone"


def test_every_writer_of_a_derived_table_is_registered():
    """A module that writes a data table through fact_file must be in DERIVERS, or the one command misses it."""
    import pathlib

    trace = pathlib.Path(derive.__file__).parent
    writers = {p.stem for p in trace.glob("*.py") if "write_or_check" in p.read_text() and p.stem != "fact_file"}
    assert writers == {d.module for d in derive.DERIVERS}
    assert all(d.table.exists() for d in derive.DERIVERS)


def test_the_shipped_autocast_table_matches_the_installed_torch_and_a_moved_one_is_reported(tmp_path, capsys):
    d = next(x for x in derive.DERIVERS if x.name == "autocast")
    assert derive.main(["--only", "autocast"]) == 0
    assert "cuda_autocast.toml: unchanged" in capsys.readouterr().out
    shipped = tmp_path / "cuda_autocast.toml"
    shipped.write_text(d.table.read_text().replace('torch = "', 'torch = "0.', 1))
    did, lines = derive.rederive(derive.Deriver("autocast", "autocast", shipped))
    assert did and lines[0] == "cuda_autocast.toml: 1 fact(s) moved" and lines[1].startswith("  torch: '0.")


def test_an_unknown_table_name_is_one_line_with_the_valid_ones(capsys):
    assert derive.main(["--only", "nonesuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "choose from: activations, peft" in err
