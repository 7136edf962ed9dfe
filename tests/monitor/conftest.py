import json

import pytest

from memfit.interfaces.cli.main import main


@pytest.fixture
def watch(capsys):
    """memfit watch ARGS... -> (exit code, stdout, stderr)."""
    def run(*args):
        code = main(["watch", *map(str, args)])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def watch_json(watch):
    def run(*args):
        code, out, err = watch(*args, "--json")
        assert code == 0, err
        return json.loads(out)
    return run
