"""Issue 30: `memfit fit` takes the flags its own advice names. A file with flash attention and bf16 on a T4 used to
end in "use --attn sdpa" / "use --precision fp16-mixed", flags fit refused; now each piece of advice, added to the
same fit command, is accepted and taken (written into the file). And every flag any message fit can print names
(the scenario's checks, fit's own words) is an option of fit's parser."""
import ast
import re
import shlex
from pathlib import Path

from memfit.interfaces.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "tests/formats/examples/llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml"
# the modules whose messages fit prints: the scenario's checks and fit's own
SOURCES = ["memfit/facts/scenario.py", "memfit/facts/methods.py", "memfit/interfaces/cli/fit.py",
           "memfit/interfaces/cli/fit_asked.py", "memfit/interfaces/cli/fit_files.py", "memfit/interfaces/files.py",
           "memfit/planner/search.py"]


def _fit_options() -> set[str]:
    fit = build_parser()._subparsers._group_actions[0].choices["fit"]
    return {s for action in fit._actions for s in action.option_strings}


def _advice(err: str) -> list[str]:
    """The flags a message says to use, with their values: "use --attn sdpa" -> ["--attn", "sdpa"]."""
    m = re.search(r"use (--[a-z0-9-]+(?: [^-\s;,)][^\s;,)]*)?)", err)
    return shlex.split(m.group(1)) if m else []


def test_following_fits_advice_on_a_t4_ends_in_a_written_file_that_says_it(tmp_path, capsys):
    argv = ["fit", str(YAML), "--gpu", "t4", "--gpus", "4", "--out", str(tmp_path / "out")]
    taken = []
    for _ in range(4):
        rc = main([*argv, *taken])
        err = capsys.readouterr().err
        if rc == 0:
            break
        advice = _advice(err)
        assert rc == 2 and advice, err  # refused with a flag to use
        build_parser().parse_args([*argv, *taken, *advice])  # fit's own parser takes it (exits 2 if not)
        taken += advice
    assert rc == 0 and {"--attn", "--precision"} <= set(taken), taken
    written = (tmp_path / "out" / YAML.name).read_text()
    assert "flash_attn: sdpa" in written and "fp16: true" in written  # the asked settings are in the file


def test_an_asked_setting_the_file_has_no_key_for_is_one_line_naming_it(tmp_path, capsys):
    ds = ROOT / "tests/formats/examples/deepspeed/ds_config_explicit.json"
    rc = main(["fit", str(ds), "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "a100-40gb", "--attn", "sdpa",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("memfit: error: --attention")
    assert "has no key for attention" in err and not (tmp_path / "out").exists()


def test_every_flag_fits_messages_name_is_a_flag_fit_accepts():
    options = _fit_options()
    named = set()
    for source in SOURCES:
        for node in ast.walk(ast.parse((ROOT / source).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = re.sub(r"`memfit [^`]*`", "", node.value)  # another command's flags, quoted as a command
                text = re.sub(r"memfit (plan|estimate)\b.*", "", text)
                named |= {(source, f) for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)}
    assert len(named) > 20  # the scan sees the messages
    unknown = sorted((s, f) for s, f in named if f not in options and "--" + f.removeprefix("--no-") not in options)
    assert not unknown, unknown
