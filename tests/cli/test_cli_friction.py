"""Issue 30 item 7 and the GPU half of item 6: a misspelled flag or command gets a close spelling, in one line that
says "memfit: error:" once; choice values are matched whatever their case; `memfit models` / `gpus` print one
line per entry with its aliases, an empty filter says so; a GPU name several cards share is an error naming them."""
import pytest

from memfit.facts.catalog import find_gpu, gpus, models
from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser, main

BASE = ["estimate", "qwen2-7b", "--gpu", "rtx4090"]
DRIVER_SPREAD = 256 * 2**20  # bytes one card's reported memory moves by between drivers (data/gpus.toml header)


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured.err
    assert lines[0].startswith("memfit: error: ") and lines[0].count("memfit:") == 1, lines[0]
    return lines[0]


def test_a_misspelled_flag_gets_the_flag_it_was_meant_to_be(capsys):
    line = _error(capsys, [*BASE, "--micro-bach", "2"])
    assert line == "memfit: error: unknown option --micro-bach; did you mean --micro-batch?"


def test_each_misspelled_flag_is_named_with_its_own_suggestion(capsys):
    line = _error(capsys, [*BASE, "--micro-bach=2", "--grad-acum", "4"])
    assert "--micro-bach: did you mean --micro-batch?" in line and "--grad-acum: did you mean --grad-accum?" in line


def test_a_flag_nothing_is_close_to_points_at_the_help(capsys):
    line = _error(capsys, [*BASE, "--zzzzzz"])
    assert "unknown option --zzzzzz" in line and "memfit estimate --help" in line and "did you mean" not in line


def test_a_misspelled_command_gets_the_command(capsys):
    line = _error(capsys, ["estimat", "qwen2-7b"])
    assert "unknown command 'estimat'; did you mean estimate?" in line and "plan" in line


def test_choice_values_ignore_case():
    def scenario(*extra):
        return scenario_from_args(build_parser().parse_args([*BASE, *extra]))

    assert scenario("--tuning", "Lora", "--attn", "FLASH", "--profile", "LlamaFactory") == \
        scenario("--tuning", "lora", "--attn", "flash", "--profile", "llamafactory")


def test_a_value_of_no_choice_still_names_the_valid_ones(capsys):
    line = _error(capsys, [*BASE, "--tuning", "Loraa"])
    assert "'Loraa'" in line and "qlora" in line


def _listing(capsys, *argv) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().out.rstrip("\n").splitlines()


@pytest.mark.parametrize("kind", ["models", "gpus"])
def test_the_catalogs_print_one_line_per_entry_with_its_aliases(capsys, kind):
    entries = models() if kind == "models" else gpus()
    code, lines = _listing(capsys, kind)
    assert code == 0
    assert len(lines) == len(entries) + 3  # the count, the column names, the entries, the next step
    assert lines[0].startswith(f"{len(entries)} ") and lines[-1].startswith("next: memfit estimate")
    for entry in entries:
        mine = [line for line in lines[2:-1] if line.split()[0] == entry.id]
        assert len(mine) == 1, entry.id
        assert all(alias in mine[0] for alias in entry.aliases)


def test_a_filter_keeps_the_entries_it_names(capsys):
    code, lines = _listing(capsys, "gpus", "a100")
    assert code == 0
    assert sorted(line.split()[0] for line in lines[2:-1]) == sorted(g.id for g in gpus() if "a100" in g.id)


@pytest.mark.parametrize("kind", ["models", "gpus"])
def test_an_empty_filter_says_so_in_one_line(capsys, kind):
    code, lines = _listing(capsys, kind, "zzz")
    assert code == 1 and len(lines) == 1
    assert "matches 'zzz'" in lines[0] and f"`memfit {kind}` lists all" in lines[0]


@pytest.mark.parametrize("name, variants", [("a100", ("a100-40gb", "a100-80gb")), ("V100", ("v100-16gb", "v100-32gb"))])
def test_a_gpu_name_several_cards_share_is_an_error_naming_them(capsys, name, variants):
    line = _error(capsys, ["estimate", "qwen2-7b", "--gpu", name])
    assert f"GPU {name!r} names" in line and all(v in line for v in variants)
    assert {find_gpu(v).id for v in variants} == set(variants)  # each variant, said in full, is its card


def test_no_alias_picks_one_memory_size_among_cards_it_could_mean():
    """An alias that is the bare name of several cards (`a800`: SXM or PCIe) may stand for one of them only when
    they hold the same memory, up to what one card reports across drivers (~200 MiB, data/gpus.toml): the answer
    does not depend on the pick. (`a100` could mean 40 or 80 GB: no alias.)"""
    from memfit.facts.gpu_catalog import _variants
    from memfit.facts.names import norm as _norm

    for g in gpus():
        for alias in g.aliases:
            sizes = {find_gpu(v).memory_bytes for v in _variants(_norm(alias))}
            assert not sizes or max(sizes) - min(sizes) < DRIVER_SPREAD, (g.id, alias, sizes)
