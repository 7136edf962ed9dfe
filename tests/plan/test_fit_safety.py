"""`memfit fit` never puts the user's files at risk: every write is atomic and all-or-nothing, the original stays
byte-identical (with its permission bits) on any error, --in-place keeps a backup it never overwrites, and a
second `fit --in-place` finds nothing to change. Failures are injected with monkeypatch on real files."""
import argparse
import errno
import os
import stat
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import cards
from memfit.errors import MemfitError
from memfit.interfaces.cli.main import main
from memfit.interfaces.files import FileWrite, write_files

EXAMPLES = Path(__file__).resolve().parents[1] / "formats" / "examples"
# (file, arguments) that make each format need a change: oom as written, fits after `memfit fit`
LLAMAFACTORY = ("llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml", ["--gpu", "rtx4090", "--gpus", "7"])
ACCELERATE = ("accelerate/deepspeed_zero3.yaml", ["--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "2"])
# the DeepSpeed example in fp16 on V100s (no bf16, no flash attention: every plan is one a DeepSpeed JSON can say
# alone), its train_batch_size "auto" so 8 GPUs are valid
DEEPSPEED = ("deepspeed/ds_config_explicit.json", ["--model", "llama-2-7b", "--gpu", "v100-32gb", "--gpus", "8"])


def _copy(tmp_path: Path, case, mode: int = 0o640) -> tuple[Path, list[str]]:
    name, args = case
    text = (EXAMPLES / name).read_text()
    if name.endswith("ds_config_explicit.json"):
        text = text.replace('"bf16"', '"fp16"').replace('"train_batch_size": 32', '"train_batch_size": "auto"')
    path = tmp_path / Path(name).name
    path.write_text(text)
    path.chmod(mode)
    return path, args


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every entry of a folder: bytes and permission bits (a leftover temp file or backup shows up too)."""
    return {p.name: (b"<folder>" if p.is_dir() else p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(folder.iterdir())}


def _fit(path: Path, args: list[str], *extra: str) -> int:
    return main(["fit", str(path), *args, *extra])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memfit: error: "), err
    return err[0]


# --- the module that writes users' files --------------------------------------------------------------------

def _three_files(tmp_path: Path) -> list[FileWrite]:
    a, b = tmp_path / "a.yaml", tmp_path / "b.json"
    a.write_text("a: 1\n")
    b.write_text("{}\n")
    a.chmod(0o600)
    b.chmod(0o644)
    return [FileWrite(a, "a: 2\n", "a: 1\n"), FileWrite(b, '{"b": 2}\n', "{}\n"),
            FileWrite(tmp_path / "new" / "c.txt", "c\n", None)]


def test_a_write_replaces_the_file_keeps_its_mode_and_backs_it_up(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("micro_batch: 4\n")
    path.chmod(0o640)
    [done] = write_files([FileWrite(path, "micro_batch: 2\n", "micro_batch: 4\n")], backup=True)
    assert path.read_text() == "micro_batch: 2\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert done.backup == tmp_path / "train.yaml.memfit-bak" and done.backup.read_text() == "micro_batch: 4\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml", "train.yaml.memfit-bak"]  # no temp left


def test_an_existing_backup_is_never_overwritten(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("v2\n")
    (tmp_path / "train.yaml.memfit-bak").write_text("v1\n")
    [done] = write_files([FileWrite(path, "v3\n")], backup=True)
    assert (tmp_path / "train.yaml.memfit-bak").read_text() == "v1\n"
    assert done.backup == tmp_path / "train.yaml.memfit-bak.1" and done.backup.read_text() == "v2\n"


def test_the_same_bytes_are_not_written_again(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("a: 1\n")
    before = path.stat()
    [done] = write_files([FileWrite(path, "a: 1\n")], backup=True)
    assert done.unchanged and done.backup is None
    assert path.stat().st_ino == before.st_ino and path.stat().st_mtime_ns == before.st_mtime_ns
    assert [p.name for p in tmp_path.iterdir()] == ["train.yaml"]


def test_windows_line_ends_are_kept(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_bytes(b"a: 1\r\nb: 2\r\n")
    write_files([FileWrite(path, "a: 1\nb: 3\n", "a: 1\nb: 2\n")])
    assert path.read_bytes() == b"a: 1\r\nb: 3\r\n"


def test_a_symlink_outside_its_folder_is_refused_one_inside_is_written_through(tmp_path):
    outside = tmp_path / "elsewhere" / "real.yaml"
    outside.parent.mkdir()
    outside.write_text("a: 1\n")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "link.yaml").symlink_to(outside)
    with pytest.raises(MemfitError, match="symlink to .*outside"):
        write_files([FileWrite(folder / "link.yaml", "a: 2\n")])
    assert outside.read_text() == "a: 1\n"
    (folder / "real.yaml").write_text("b: 1\n")
    (folder / "inside.yaml").symlink_to("real.yaml")
    [done] = write_files([FileWrite(folder / "inside.yaml", "b: 2\n")], backup=True)
    assert (folder / "inside.yaml").is_symlink() and (folder / "real.yaml").read_text() == "b: 2\n"
    assert done.path == (folder / "real.yaml").resolve()


def test_a_folder_or_a_special_file_is_refused(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(MemfitError, match="is a folder"):
        write_files([FileWrite(tmp_path / "dir.yaml", "a: 1\n")])
    os.mkfifo(tmp_path / "pipe.yaml")
    with pytest.raises(MemfitError, match="not a regular file"):
        write_files([FileWrite(tmp_path / "pipe.yaml", "a: 1\n")])
    assert (tmp_path / "dir.yaml").is_dir() and stat.S_ISFIFO(os.lstat(tmp_path / "pipe.yaml").st_mode)


def test_a_file_changed_since_it_was_read_or_one_that_appeared_is_refused(tmp_path):
    writes = _three_files(tmp_path)
    writes[1].path.write_text('{"edited": "meanwhile"}\n')
    before = _snapshot(tmp_path)
    with pytest.raises(MemfitError, match="b.json: changed on disk"):
        write_files(writes, backup=True)
    assert _snapshot(tmp_path) == before
    (tmp_path / "c.txt").write_text("mine\n")
    with pytest.raises(MemfitError, match="already exists"):
        write_files([FileWrite(tmp_path / "c.txt", "c\n", None)])
    assert (tmp_path / "c.txt").read_text() == "mine\n"


@pytest.mark.parametrize("failing_call", [1, 2, 3])
def test_a_change_set_is_all_or_nothing_when_a_rename_fails(tmp_path, monkeypatch, failing_call):
    writes = _three_files(tmp_path)
    before = _snapshot(tmp_path)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == failing_call:
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(MemfitError) as e:
        write_files(writes, backup=True)
    assert "\n" not in str(e.value) and "no file was changed" in str(e.value)
    assert _snapshot(tmp_path) == before  # restored byte-identical with their modes; no backup, temp or new folder


def test_the_originals_come_back_even_when_no_rename_works_any_more(tmp_path, monkeypatch):
    writes = _three_files(tmp_path)
    before = _snapshot(tmp_path)
    real_replace, calls = os.replace, []

    def replace(src, dst):  # the first rename works, then the disk refuses every rename (the undo's too)
        calls.append(dst)
        if len(calls) > 1:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(MemfitError, match="no file was changed"):
        write_files(writes, backup=True)
    assert _snapshot(tmp_path) == before


def test_an_interrupt_mid_set_restores_the_files_and_is_not_swallowed(tmp_path, monkeypatch):
    writes = _three_files(tmp_path)
    before = _snapshot(tmp_path)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_files(writes, backup=True)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("failure", ["temp file", "fsync", "backup"])
def test_the_originals_stay_when_a_temp_file_fsync_or_backup_fails(tmp_path, monkeypatch, failure):
    writes = _three_files(tmp_path)
    before = _snapshot(tmp_path)
    if failure == "temp file":
        monkeypatch.setattr(tempfile, "mkstemp", _raises(errno.ENOSPC, "No space left on device"))
    elif failure == "fsync":
        monkeypatch.setattr(os, "fsync", _raises(errno.EIO, "Input/output error"))
    else:
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda path, *a, **k: _raises(errno.EACCES, "Permission denied")()
                            if ".memfit-bak" in str(path) else real_open(path, *a, **k))
    with pytest.raises(MemfitError) as e:
        write_files(writes, backup=True)
    assert "\n" not in str(e.value) and "no file was changed" in str(e.value)
    assert _snapshot(tmp_path) == before


def _raises(code: int, message: str):
    def fail(*args, **kwargs):
        raise OSError(code, message)
    return fail


# --- memfit fit: the original stays byte-identical on any error ---------------------------------------------

def test_a_file_that_does_not_read_is_left_alone(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text("stage: sft\nfinetuning_type: lora\ncutoff_len: long\nmodel_name_or_path: llama3-8b\n")
    before = _snapshot(tmp_path)
    assert _fit(path, ["--gpu", "rtx4090", "--gpus", "1"], "--in-place") == 2
    assert "cutoff_len" in _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("broken", ["planner", "rendering"])
def test_a_failing_plan_or_rendering_leaves_the_file_alone(tmp_path, monkeypatch, capsys, broken):
    import memfit.interfaces.formats as formats
    import memfit.planner.plan as planner

    path, args = _copy(tmp_path, ACCELERATE)
    before = _snapshot(tmp_path)

    def fail(*a, **k):
        raise MemfitError(f"the {broken} failed")

    monkeypatch.setattr(planner, "plan", fail) if broken == "planner" else \
        monkeypatch.setattr(formats, "write_config_files", fail)
    assert _fit(path, args, "--in-place") == 2
    assert _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


def test_a_crash_after_planning_leaves_the_file_alone(tmp_path, monkeypatch):
    import memfit.interfaces.formats as formats

    path, args = _copy(tmp_path, ACCELERATE)
    before = _snapshot(tmp_path)
    monkeypatch.setattr(formats, "diff", lambda files: 1 / 0)  # a bug anywhere before the write
    with pytest.raises(ZeroDivisionError):
        _fit(path, args, "--in-place")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("failure", ["temp file", "rename", "backup"])
def test_fit_in_place_leaves_the_file_byte_identical_when_writing_fails(tmp_path, monkeypatch, capsys, failure):
    path, args = _copy(tmp_path, ACCELERATE)
    before = _snapshot(tmp_path)
    if failure == "temp file":
        monkeypatch.setattr(tempfile, "mkstemp", _raises(errno.ENOSPC, "No space left on device"))
    elif failure == "rename":
        monkeypatch.setattr(os, "replace", _raises(errno.EXDEV, "Invalid cross-device link"))
    else:
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda p, *a, **k: _raises(errno.EDQUOT, "Disk quota exceeded")()
                            if ".memfit-bak" in str(p) else real_open(p, *a, **k))
    assert _fit(path, args, "--in-place") == 2
    line = _one_error_line(capsys)
    assert path.name in line and "no file was changed" in line
    assert _snapshot(tmp_path) == before


def test_fit_in_place_does_not_overwrite_an_edit_made_while_it_planned(tmp_path, monkeypatch, capsys):
    import memfit.planner.plan as planner

    path, args = _copy(tmp_path, ACCELERATE)
    real_plan = planner.plan

    def plan_while_the_user_edits(*a, **k):
        if "# my edit" not in path.read_text():  # fit may plan more than once (a faster plan another file says)
            path.write_text(path.read_text() + "# my edit\n")
        return real_plan(*a, **k)

    monkeypatch.setattr(planner, "plan", plan_while_the_user_edits)
    before_plan = path.read_text() + "# my edit\n"
    assert _fit(path, args, "--in-place") == 2
    assert "changed on disk" in _one_error_line(capsys)
    assert path.read_text() == before_plan and not (tmp_path / f"{path.name}.memfit-bak").exists()


def test_fit_in_place_keeps_the_mode_and_a_backup(tmp_path, capsys):
    path, args = _copy(tmp_path, ACCELERATE, mode=0o604)
    original = path.read_bytes()
    assert _fit(path, args, "--in-place") == 0
    assert path.read_bytes() != original and stat.S_IMODE(path.stat().st_mode) == 0o604
    backup = tmp_path / f"{path.name}.memfit-bak"
    assert backup.read_bytes() == original and f"the original is in {backup}" in capsys.readouterr().out


def test_fit_refuses_an_out_folder_that_holds_the_file_itself(tmp_path, monkeypatch, capsys):
    path, args = _copy(tmp_path, ACCELERATE)
    before = _snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert _fit(Path(path.name), args, "--out", ".") == 2
    assert "--in-place" in _one_error_line(capsys)
    assert _snapshot(tmp_path) == before


def test_fit_writes_the_command_and_its_code_edit_together_or_not_at_all(tmp_path, monkeypatch, capsys):
    """OpenRLHF: the command and FILE.code-edit.txt are one change set; the second rename fails."""
    command = tmp_path / "qwen25_72b_offload.sh"
    text = (EXAMPLES / "openrlhf" / command.name).read_text()
    command.write_text(text.replace("--micro_train_batch_size 1", "--micro_train_batch_size 2"))
    # a card where the host fix (pin_memory, ratio: the code edit) needs one row per micro-batch beside it (a flag
    # of the command): the plan changes both files
    run = cards.from_file(str(command), gpu="a100-80gb", gpus_per_node=8, host_ram="1.4TB")
    host_fix = {"pin_memory": False, "ratio": 0.7}
    one_row = {"micro_batch": 1, "grad_accum": run.grad_accum * 2}
    capacity = cards.card(run, host_fix | one_row, not_enough=(host_fix,))
    args = ["--gpu", "a100-80gb", "--gpus", "8", "--host-ram", "1.4TB", *cards.gpu_mem(capacity)]
    before = _snapshot(tmp_path)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert _fit(command, args, "--in-place") == 2
    assert "no file was changed" in _one_error_line(capsys)
    assert len(calls) >= 2 and _snapshot(tmp_path) == before
    monkeypatch.setattr(os, "replace", real_replace)
    assert _fit(command, args, "--in-place") == 0  # the same run, once the disk works: both files
    assert command.read_bytes() != before[command.name][0]
    assert (tmp_path / f"{command.name}.code-edit.txt").exists()


# --- idempotent: a second `fit --in-place` changes nothing ----------------------------------------------------

@pytest.mark.parametrize("case", [DEEPSPEED, LLAMAFACTORY, ACCELERATE], ids=["deepspeed", "llamafactory", "accelerate"])
def test_fit_in_place_twice_gives_the_file_of_the_first_run(tmp_path, capsys, case):
    path, args = _copy(tmp_path, case)
    original = path.read_bytes()
    assert _fit(path, args, "--in-place") == 0
    first = _snapshot(tmp_path)
    assert first[path.name][0] != original and first[f"{path.name}.memfit-bak"][0] == original
    capsys.readouterr()
    assert _fit(path, args, "--in-place") == 0
    assert _snapshot(tmp_path) == first, capsys.readouterr().out  # same bytes, no second backup



def test_a_plan_that_leaves_zero3_also_writes_the_ratio_it_reset(tmp_path):
    """A plan ZeRO-3 -> 2 runs with offload ratio 1 (DeepSpeed rejects ratio < 1 outside ZeRO-3). Writing only the
    knobs of the changed axes kept the file's 0.9: a file DeepSpeed and the next `memfit fit` reject."""
    from memfit.interfaces.cli.args import blank_arguments, scenario_from_args
    from memfit.interfaces.cli.fit import _file_changes
    from memfit.interfaces.formats import exportable, knobs_from_scenario, read_config, write_config_files

    path, _ = _copy(tmp_path, DEEPSPEED)
    run = {"model": "llama-2-7b", "gpu": "v100-32gb", "gpu_mem": None, "gpus_per_node": 8, "nodes": 1, "host_ram": None}
    base = scenario_from_args(argparse.Namespace(**{**blank_arguments(), **run, "from_file": str(path)}))
    assert base.zero_stage == 3 and base.ratio == 0.9
    row = SimpleNamespace(changes=[SimpleNamespace(knob="sharding", code_edit=None)],
                          scenario=base.with_changes(zero_stage=2, ratio=1.0))
    changed = _file_changes(row, knobs_from_scenario(base), exportable("deepspeed"))
    assert changed["zero_stage"] == 2 and changed["ratio"] == 1.0
    written = tmp_path / "written.json"
    written.write_text(write_config_files(read_config(path, gpus=8), changed)[0].new_text)
    again = scenario_from_args(argparse.Namespace(**{**blank_arguments(), **run, "from_file": str(written)}))
    assert again.zero_stage == 2 and again.ratio == 1.0  # the written file is a run DeepSpeed accepts
