"""Every subcommand's --help ends with examples that parse, and its usage line fits 80 columns."""
import argparse
import contextlib
import io
import shlex

import pytest

from memfit.interfaces.cli.main import build_parser


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def help_text(name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([name, "--help"])
    return out.getvalue()


def examples(text: str) -> list[str]:
    lines = text.rstrip().split("\nexamples:\n", 1)[1].splitlines()
    return [line.strip() for line in lines]


@pytest.mark.parametrize("name", sorted(commands()))
def test_help_ends_with_examples_that_parse(name):
    text = help_text(name)
    assert "\nexamples:\n" in text
    shown = examples(text)
    assert 2 <= len(shown) <= 4
    for example in shown:
        argv = shlex.split(example)
        assert argv[:2] == ["memfit", name], example
        args = build_parser().parse_args(argv[1:])  # parsed, not run
        assert args.command == name


@pytest.mark.parametrize("name", sorted(commands()))
def test_usage_and_examples_fit_80_columns(name):
    text = help_text(name)
    usage = text.split("\n\n", 1)[0].splitlines()
    assert usage[0].startswith(f"usage: memfit {name}")
    assert all(len(line) <= 80 for line in usage + [f"  {e}" for e in examples(text)]), usage
