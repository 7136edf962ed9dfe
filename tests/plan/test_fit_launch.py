"""`memfit fit LAUNCH` (issue 12 item 5): every file the launch uses is rewritten where the value it changes is
stated (a command-line word over the file it overrides), as one change set, and the whole launch read back is the
plan. Runs on copies of tests/formats/launch_examples beside the config examples they name."""
import errno
import functools
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import cards
from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main

FORMATS = Path(__file__).resolve().parents[1] / "formats"
RTX = ["--gpu", "rtx4090"]
AH, TRL = "launch_examples/alignment_handbook", "launch_examples/trl"
OFFLOAD = {"offload_optimizer": "cpu"}
OFFLOAD_BOTH = {"offload_optimizer": "cpu", "offload_param": "cpu"}


def _micro_one(run) -> dict:
    """Micro-batch 1 at the run's global batch."""
    return {"micro_batch": 1, "grad_accum": run.micro_batch * run.grad_accum}


@dataclass(frozen=True)
class Form:
    """A launch form: its GPU, the files fit must change (relative to the copied tests/formats folder: the script
    where a word states the value, the files it names otherwise) and the change that makes it fit. The card is
    derived (tests/cards.py): the smallest on which the change fits and the launch as written does not, nor
    with any change of `not_enough` (what would fit by touching fewer of the files)."""

    gpu: list[str]
    expected: set[str]
    change: Callable  # run -> knobs
    not_enough: Callable = lambda run: ()  # run -> (knobs, ...)
    fit_args: tuple[str, ...] = ()


def _offload(run) -> dict:
    """The most a DeepSpeed file moves to the CPU: the optimizer, and under ZeRO-3 the parameters too."""
    return OFFLOAD_BOTH if run.zero_stage == 3 else OFFLOAD


def _both(run) -> dict:
    """A smaller micro-batch (a script word) and the offload (a DeepSpeed setting in another file)."""
    return _micro_one(run) | _offload(run)


def _either(run) -> tuple[dict, ...]:
    return _micro_one(run), OFFLOAD, _offload(run)


FORMS = {
    # llamafactory-cli train X.yaml: a key of the YAML (Liger's loss), not the DeepSpeed JSON it names (offload)
    "llamafactory_lora_sft_ds3.sh": Form(RTX, {"examples/llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml"},
                                         lambda run: {"loss": "liger"}),
    # key=value over the YAML: the micro-batch where the script says it, the accumulation in the YAML
    "llamafactory_overrides.sh": Form(RTX, {"launch_examples/llamafactory_overrides.sh",
                                            "examples/llamafactory/examples/train_lora/llama3_lora_sft.yaml"}, _micro_one),
    # accelerate launch --config_file: the micro-batch on the script's line, the offload in accelerate's config
    "alignment_handbook/launch_sft.sh": Form(RTX, {f"{AH}/launch_sft.sh", f"{AH}/recipes/accelerate_configs/zero3.yaml"},
                                             _both, _either),
    # DeepSpeed-Chat's own flags: --offload added to the script (its ZeRO stage is a shell variable)
    "deepspeed_examples/run_llama2_7b.sh": Form(RTX, {"launch_examples/deepspeed_examples/run_llama2_7b.sh"},
                                                lambda run: OFFLOAD_BOTH),
    "hf/deepspeed_num_gpus.sh": Form(["--gpu", "a100-80gb"], {"launch_examples/hf/deepspeed_num_gpus.sh",
                                                              "examples/hf/ds_config_zero2.json"}, _both, _either),
    "hf/torchrun_run_clm.sh": Form(RTX, {"launch_examples/hf/torchrun_run_clm.sh", "examples/hf/ds_config_zero2.json"},
                                   _both, _either),
    "trl/dpo_module.sh": Form(RTX, {"launch_examples/trl/dpo_module.sh"}, _micro_one),  # python -m
    # trl sft --config: no setting its command line states lowers this run's memory (a smaller micro-batch adds
    # accumulation); the 8-bit optimizer goes in the config file. The planner tries each optimizer first at its
    # least-memory activations (micro-batch 1): the card holds it there
    "trl/sft_cli.txt": Form(RTX, {f"{TRL}/examples/cli_configs/example_config.yaml"},
                            lambda run: _micro_one(run) | {"optimizer": "adamw-8bit"}, fit_args=("--allow", "8bit")),
    # accelerate launch --config_file with a ZeRO-3 config: the offload in accelerate's config (a 0.5B model under a
    # 12 GiB band); the fastest plan that fits offloads only the optimizer and takes micro-batch 1 on the script's
    # line (a one-row batch has no padding) with flash attention there too
    "trl/sft_zero3.sh": Form(RTX, {"launch_examples/trl/sft_zero3.sh",
                                   f"{TRL}/examples/accelerate_configs/deepspeed_zero3.yaml"}, lambda run: OFFLOAD_BOTH),
}


@functools.cache
def _hardware(relative: str) -> tuple[str, ...]:
    """The form's GPU on its derived card."""
    form = FORMS[relative]
    run = cards.from_file(str(FORMATS / "launch_examples" / relative), gpu=form.gpu[1])
    return (*form.gpu, *cards.gpu_mem(cards.card(run, form.change(run), form.not_enough(run))))


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # paths fit prints and writes are relative to here
    for name in ("examples", "launch_examples"):
        shutil.copytree(FORMATS / name, tmp_path / name)
    return tmp_path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fit(script: Path, hw: list[str], *extra: str) -> int:
    return main(["fit", str(script), *hw, *extra])


def _plan(out: str) -> tuple[str, str, float]:
    m = re.search(r": (\w+) \([\d.]+ GiB per GPU\) -> (\w+) \(([\d.]+) GiB", out)
    assert m, out
    return m.group(1), m.group(2), float(m.group(3))


def _estimate(capsys, script: Path, hw: list[str]) -> dict:
    capsys.readouterr()
    assert main(["estimate", "--from", str(script), *hw, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _words_only(old: str, new: str) -> None:
    """The script keeps every comment and continuation; a changed line keeps its flag (only a value changed) and
    a new line is a new flag."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    assert [x for x in old_lines if x.lstrip().startswith("#")] == [x for x in new_lines if x.lstrip().startswith("#")]
    assert sum(x.rstrip().endswith("\\") for x in new_lines) >= sum(x.rstrip().endswith("\\") for x in old_lines)
    kept = [x for x in old_lines if x in new_lines]
    for line in (x for x in old_lines if x not in new_lines):
        flag = re.match(r"\s*(\S+?)(?:=|\s|$)", line).group(1)
        assert any(n.lstrip().startswith(flag) for n in new_lines if n not in kept), (line, new)


@pytest.mark.parametrize("relative", sorted(FORMS))
def test_every_launch_form_is_fitted_in_place_and_reads_back_as_the_plan(tree, capsys, relative):
    hw, expected, extra = list(_hardware(relative)), FORMS[relative].expected, FORMS[relative].fit_args
    script = tree / "launch_examples" / relative
    before = _snapshot(tree)
    assert _estimate(capsys, script, hw)["verdict"] in ("oom", "tight")
    assert _fit(script, hw, "--in-place", *extra) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    start, verdict, gib = _plan(out)
    assert start in ("oom", "tight") and verdict == "fits"
    after = _snapshot(tree)
    changed = {k for k in after if before.get(k) != after[k] and not k.split("/")[-1].count(".memfit-bak")}
    assert changed == expected, out
    assert {k.split(".memfit-bak")[0] for k in after if ".memfit-bak" in k} == expected  # one backup per file
    assert all(after[k + ".memfit-bak"] == before[k] for k in expected)
    if f"launch_examples/{relative}" in expected:
        _words_only(before[f"launch_examples/{relative}"].decode(), after[f"launch_examples/{relative}"].decode())
    again = _estimate(capsys, script, hw)  # the whole launch, re-read from disk
    assert again["verdict"] == "fits"
    assert abs(again["per_rank"]["device_total"]["peak_bytes"] / 2**30 - gib) < 0.02 * 24
    assert _fit(script, hw, "--in-place", *extra) == 0  # a second run: already fits, nothing written
    assert "nothing to change, nothing written" in capsys.readouterr().out
    assert _snapshot(tree) == after


@pytest.mark.parametrize("relative", sorted(FORMS))
def test_on_the_examples_gpu_a_launch_that_fits_is_left_alone(tree, capsys, relative):
    """On the A100 the launch tests use: what fits is not touched; what does not is fitted."""
    script = tree / "launch_examples" / relative
    hw = ["--gpu", "a100-80gb"]
    fits = _estimate(capsys, script, hw)["verdict"] == "fits"
    before = _snapshot(tree)
    assert _fit(script, hw, "--in-place") == 0
    out = capsys.readouterr().out
    if fits:
        assert "nothing to change, nothing written" in out and _snapshot(tree) == before
    else:
        assert _plan(out)[1] == "fits" and _estimate(capsys, script, hw)["verdict"] == "fits"


def test_out_keeps_the_launch_layout_and_touches_nothing(tree, capsys):
    script = tree / "launch_examples" / "hf" / "torchrun_run_clm.sh"
    hw = list(_hardware("hf/torchrun_run_clm.sh"))
    before = _snapshot(tree)
    assert _fit(script, hw, "--out", str(tree / "out")) == 0
    assert _snapshot(tree / "launch_examples") == {k[len("launch_examples/"):]: v for k, v in before.items()
                                                   if k.startswith("launch_examples/")}
    written = _snapshot(tree / "out")
    assert set(written) == {"launch_examples/hf/torchrun_run_clm.sh", "examples/hf/ds_config_zero2.json"}
    shutil.copytree(tree / "out", tree, dirs_exist_ok=True)  # the set applied over the tree reads back as the plan
    assert _estimate(capsys, script, hw)["verdict"] == "fits"


def test_several_from_files_are_one_change_set(tree, capsys):
    recipes = tree / "launch_examples" / "alignment_handbook" / "recipes"
    files = [recipes / "zephyr-7b-beta" / "sft" / "config_full.yaml", recipes / "accelerate_configs" / "zero3.yaml"]
    # a card on which the plan needs both the offload (zero3.yaml) and a smaller micro-batch (config_full.yaml)
    run = cards.from_file([str(f) for f in files], gpu="rtx4090", gpus_per_node=8)
    hw = RTX + ["--gpus", "8", *cards.gpu_mem(cards.card(run, _both(run), _either(run)))]
    args = [x for f in files for x in ("--from", str(f))]
    assert main(["fit", *args, *hw, "--in-place"]) == 0, capsys.readouterr().err
    assert _plan(capsys.readouterr().out)[1] == "fits"
    assert all(Path(f"{f}.memfit-bak").exists() for f in files)
    capsys.readouterr()
    assert main(["estimate", *args, *hw, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "fits"


def test_a_failure_midway_writes_nothing(tree, monkeypatch, capsys):
    """The second file's rename fails: the first is put back; every file of the tree is byte-identical."""
    script = tree / "launch_examples" / "llamafactory_overrides.sh"
    before = _snapshot(tree)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert _fit(script, RTX, "--in-place") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memfit: error: ") and "no file was changed" in err[0], err
    assert _snapshot(tree) == before


def test_a_value_set_through_a_shell_variable_is_named_not_rewritten(tree):
    from memfit.interfaces.formats.launch_sources import read_launch
    from memfit.interfaces.formats.launch_write import write

    script = tree / "launch_examples" / "llamafactory_overrides.sh"
    script.write_text(script.read_text().replace("CUTOFF=4096", "CUTOFF=4096\nBATCH=2")
                      .replace("per_device_train_batch_size=2", "per_device_train_batch_size=$BATCH"))
    launch = read_launch([script], 2)
    with pytest.raises(MemfitError, match=r"per_device_train_batch_size \$BATCH: the value is a shell variable"):
        write(launch, {"micro_batch": 1})
    files = write(launch, {"loss": "liger"})  # a knob no word states goes to the YAML
    assert [f.path.name for f in files] == ["llama3_lora_sft.yaml"] and "enable_liger_kernel: true" in files[0].new_text


def test_a_change_no_file_of_the_launch_can_say_is_named(tree):
    from memfit.interfaces.formats.launch_sources import read_launch
    from memfit.interfaces.formats.launch_write import write

    launch = read_launch([tree / "launch_examples" / "trl" / "dpo_module.sh"], 1)
    with pytest.raises(MemfitError, match="no file of the launch can say checkpoint_every_n=2"):
        write(launch, {"checkpoint_every_n": 2})


@pytest.mark.parametrize("argv, needle", [
    (["fit", *RTX], "one FILE or --from FILE"),
    (["fit", "trl sft --config examples/cli_configs/example_config.yaml --per_device_train_batch_size 8 --bf16",
      *RTX, "--gpu-mem", "8GiB"], "save the command line in a script"),
])
def test_fit_without_a_file_is_one_line(tree, monkeypatch, capsys, argv, needle):
    monkeypatch.chdir(tree / "launch_examples" / "trl")  # the command line's files resolve from here
    before = _snapshot(tree)
    assert main(argv) == 2
    assert _snapshot(tree) == before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memfit: error: "), err
    assert needle in err[0]


LAUNCHER_FLAGS_ONLY = """# accelerate with launcher flags only (no config file)
accelerate launch --use_deepspeed --zero_stage 2 --num_processes 8 \\
    train.py \\
    --model_name_or_path meta-llama/Llama-2-7b-hf \\
    --per_device_train_batch_size 4 \\
    --gradient_accumulation_steps 2 \\
    --bf16 true \\
    --output_dir out
"""


def test_launcher_flags_are_changed_where_they_are_typed(tree, capsys):
    """No file at all: accelerate's --zero_stage is changed on the launch line, the script's new setting is a new
    flag line, and the launch read back is the plan."""
    script = tree / "acc.sh"
    script.write_text(LAUNCHER_FLAGS_ONLY)
    assert _estimate(capsys, script, RTX)["verdict"] == "oom"
    assert _fit(script, RTX, "--in-place") == 0, capsys.readouterr().err
    _, verdict, gib = _plan(capsys.readouterr().out)
    new = script.read_text()
    assert re.search(r"--zero_stage [013] --num_processes 8 \\", new), new
    _words_only(LAUNCHER_FLAGS_ONLY, new)
    again = _estimate(capsys, script, RTX)
    assert again["verdict"] == verdict == "fits"
    assert abs(again["per_rank"]["device_total"]["peak_bytes"] / 2**30 - gib) < 0.02 * 24
