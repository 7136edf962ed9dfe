"""The corpus of real launches (issue 12 done-when): every config file and launch script in corpus/index.toml goes
through `memfit estimate --from` and `memfit fit` end to end.

- estimate: a verdict and a number, or the one-line error the index names (a gap it records), never a traceback;
- fit on a config file: "already fits" (nothing written), or files that re-read to the planned estimate, pass the
  framework's own parser where it runs here (DeepSpeed, transformers/TRL, accelerate always; LLaMA-Factory with its
  venv; OpenRLHF with its cached wheels) and keep the global batch, packing and sequence length;
- fit on a launch: the outcome the index records; what it writes re-reads to the plan and keeps the data of a step;
- fit runs on a card derived for the outcome the index records (_card), so "fits" and "wrote" hold their meaning as
  memfit's error bands move;
- a property over the corpus: with --allow lora / 8bit, on other hardware, the data of a step stays the same.
Runs offline: a model the catalog lacks is the one-line "not in the HF cache" error, never a download.
"""
import json
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cards
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config, validate

HERE = Path(__file__).resolve().parent
INDEX = tomllib.loads((HERE / "corpus" / "index.toml").read_text())["file"]
FOLDERS = ("examples", "launch_examples", "axolotl_examples", "corpus")
PROJECTS = ("LLaMA-Factory", "OpenRLHF", "TRL", "alignment-handbook", "Qwen", "axolotl", "DeepSpeedExamples")
PLAN = re.compile(r"-> (fits|tight) \(([\d.]+) GiB")


def _id(entry: dict) -> str:
    return entry["path"]


def _hw(entry: dict, gpu: str | None = None, gpus: int | None = None) -> list[str]:
    """The index's hardware; a config file is estimated for 4 GPUs unless it says, a launch for its own count."""
    count = gpus if gpus is not None else entry.get("gpus", 0 if entry["form"] == "launch" else 4)
    extra = ["--host-ram", entry["host_ram"]] if entry.get("host_ram") else []
    return ["--gpu", gpu or entry.get("gpu", "rtx4090"), *(["--gpus", str(count)] if count else []), *extra]


def _card(entry: dict) -> list[str]:
    """The index's hardware on a card derived from memfit's own verdict for the fit outcome the index records
    (tests/cards.py), so the outcome keeps its meaning as the error bands move: "fits", the smallest card on
    which the file as written fits, plus a little; "wrote", one grid step under it, where the file as written is
    tight and a change it can say that saves memory fits. An error outcome is about the index's own card, and a
    run no card makes fit (host RAM decides) keeps it too. Call it from the launch folder (_in_cwd)."""
    hw = _hw(entry)
    if entry["fit"] not in ("fits", "wrote"):
        return hw
    count = entry.get("gpus", 0 if entry["form"] == "launch" else 4)
    run = cards.from_file(str(HERE / entry["path"]), model=entry.get("model"), gpu=entry.get("gpu", "rtx4090"),
                          gpus_per_node=count or None, host_ram=entry.get("host_ram"))
    if cards.verdict(run, cards.LARGEST) != "fits":
        return hw
    smallest = cards.smallest_fitting(run)
    return hw + cards.gpu_mem(smallest + cards.SLACK if entry["fit"] == "fits" else smallest - cards.STEP)


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """An empty HF cache, offline (huggingface_hub reads these at import: its constants are set too)."""
    from memfit.facts.catalog import _hub_model

    constants = pytest.importorskip("huggingface_hub.constants")
    for key, value in {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
                       "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _hub_model.cache_clear()
    yield
    _hub_model.cache_clear()


def _in_cwd(entry: dict, monkeypatch) -> Path:
    """Run from the launch folder the index names (LLaMA-Factory opens `deepspeed:` from there)."""
    path = HERE / entry["path"]
    monkeypatch.chdir(HERE / entry["cwd"] if entry.get("cwd") else path.parent)
    return path


def _one_line_error(err: str, code: int, expected: str) -> None:
    err = err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err and err.startswith("memfit: error:"), err
    assert expected in err, err


# --- the index ---------------------------------------------------------------------------------------------------

def test_the_index_lists_every_file_once_with_its_provenance():
    listed = [e["path"] for e in INDEX]
    on_disk = sorted(str(p.relative_to(HERE)) for folder in FOLDERS for p in (HERE / folder).rglob("*")
                     if p.is_file() and p.name != "index.toml")
    assert sorted(listed) == on_disk and len(set(listed)) == len(listed)
    assert len(listed) >= 60
    for e in INDEX:
        if e["follows"]:  # "owner/name path" at a 40-hex commit
            assert re.fullmatch(r"[\w.-]+/[\w.-]+ \S+", e["follows"]) and re.fullmatch(r"[0-9a-f]{40}", e["commit"]), e
        else:
            assert not e["commit"] and e.get("note"), e  # memfit's own file says so
        assert e["estimate"] == "ok" or e["estimate"].startswith("error: ") and e.get("gap"), e
        assert e["fit"] in ("fits", "wrote") or e["fit"].startswith("error: "), e
    for project in PROJECTS:
        assert sum(e["project"] == project for e in INDEX) >= 3, project
    assert {e["form"] for e in INDEX} >= {"launch", "deepspeed-json", "accelerate-yaml", "hf-trl-yaml",
                                           "llamafactory-yaml", "openrlhf-command", "axolotl-yaml"}


# --- estimate --from ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", INDEX, ids=_id)
def test_estimate_from_gives_a_number_or_the_recorded_gap(entry, monkeypatch, capsys):
    path = _in_cwd(entry, monkeypatch)
    model = [entry["model"]] if entry.get("model") else []
    code = main(["estimate", *model, "--from", str(path), *_hw(entry), "--json"])
    got = capsys.readouterr()
    if entry["estimate"] != "ok":
        _one_line_error(got.err, code, entry["estimate"][len("error: "):])
        return
    assert code == 0, got.err
    doc = json.loads(got.out)
    assert doc["verdict"] in ("fits", "tight", "oom", "host_oom")
    assert doc["per_rank"]["device_total"]["peak_bytes"] > 2**30


# --- fit -----------------------------------------------------------------------------------------------------------

def _data(imported, gpus: int) -> tuple:
    """What one optimizer step trains on: global batch, packing (padding), sequence length."""
    k = imported.knobs
    return k.get("micro_batch", 1) * k.get("grad_accum", 1) * gpus, k.get("padding"), k.get("seq_len")


def _parser_accepts(imported, cwd: Path, gpus: int) -> None:
    """The framework's own parser on what fit wrote, where that parser runs here."""
    fmt = imported.format
    if fmt == "deepspeed":
        validate.validate_deepspeed(imported.text, world_size=gpus)
    elif fmt == "hf":
        pytest.importorskip("trl")
        validate.validate_hf(imported.text, (imported.variant or "training_args").split(":")[0])
    elif fmt == "accelerate":
        validate.validate_accelerate(imported.text)
    elif fmt == "llamafactory" and (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():
        parsed = validate.validate_llamafactory(imported.text, base_dir=cwd)
        assert parsed["per_device_train_batch_size"] == imported.knobs["micro_batch"]
    elif fmt == "openrlhf":
        _openrlhf_accepts(imported)
    for companion in imported.companions.values():  # the DeepSpeed JSON a file names
        if companion.format == "deepspeed":
            validate.validate_deepspeed(companion.text, world_size=gpus)


def _openrlhf_accepts(imported) -> None:
    from memfit.interfaces.formats import openrlhf as orl
    from memfit.interfaces.formats import validate_openrlhf

    try:
        validate_openrlhf.openrlhf_source(imported.variant, imported.doc.script)
    except Exception:  # noqa: BLE001 - no cached wheel and no index to fetch it: the parser does not run here
        return
    validate_openrlhf.validate_openrlhf(orl.arguments(imported), imported.variant, imported.doc.script)


def _reads_back_as_the_plan(entry, written: Path, out: str, capsys, hw: list[str]) -> None:
    planned = float(PLAN.search(out).group(2))
    model = [entry["model"]] if entry.get("model") else []
    assert main(["estimate", *model, "--from", str(written), *hw, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] in ("fits", "tight")
    assert abs(doc["per_rank"]["device_total"]["peak_bytes"] / 2**30 - planned) <= max(0.5, 0.02 * planned)


def _fit(entry, tmp_path, monkeypatch, capsys, *extra: str, hw: list[str] | None = None):
    """(exit code, stdout, stderr, the --out folder, the hardware words: `hw`, else the derived card)"""
    path = _in_cwd(entry, monkeypatch)
    model = ["--model", entry["model"]] if entry.get("model") else []
    out = tmp_path / "out"
    hw = hw or _card(entry)
    code = main(["fit", str(path), *model, *hw, *extra, "--out", str(out)])
    got = capsys.readouterr()
    return code, got.out, got.err, out, hw


CONFIGS = [e for e in INDEX if e["form"] != "launch"]
LAUNCHES = [e for e in INDEX if e["form"] == "launch"]


@pytest.mark.parametrize("entry", CONFIGS, ids=_id)
def test_fit_leaves_it_writes_what_reads_back_and_parses_or_names_the_gap(entry, tmp_path, monkeypatch, capsys):
    path = HERE / entry["path"]
    gpus = int(_hw(entry)[3])
    code, out, err, folder, hw = _fit(entry, tmp_path, monkeypatch, capsys)
    if entry["fit"].startswith("error: "):
        _one_line_error(err, code, entry["fit"][len("error: "):])
        assert not folder.exists()
        return
    assert code == 0, err
    if entry["fit"] == "fits":
        assert out.startswith(f"{path.name}: fits") and "nothing written" in out and not folder.exists(), out
        return
    assert PLAN.search(out.splitlines()[0]) and "wrote" in out, out
    written = folder / path.name
    if not written.exists():  # only a code edit changes (OpenRLHF pin_memory): the command stays as it is
        assert list(folder.glob(f"{path.name}.code-edit.txt")), out
        return
    _reads_back_as_the_plan(entry, written, out, capsys, hw)
    before, after = read_config(path, gpus=gpus), read_config(written, gpus=gpus)
    assert _data(after, gpus) == _data(before, gpus)
    if entry.get("parser_rejects_original"):  # the recipe's own keys are for another release: fit adds no rejection
        with pytest.raises(validate.ValidationFailed) as original:
            _parser_accepts(before, Path.cwd(), gpus)
        with pytest.raises(validate.ValidationFailed) as rewritten:
            _parser_accepts(after, Path.cwd(), gpus)
        assert str(rewritten.value) == str(original.value)
    else:
        _parser_accepts(after, Path.cwd(), gpus)


@pytest.mark.parametrize("entry", LAUNCHES, ids=_id)
def test_fit_on_a_launch_writes_what_reads_back_as_the_plan_or_names_the_gap(entry, tmp_path, monkeypatch, capsys):
    """The launch's files are written under --out in the launch's own layout, so the rewritten launch follows
    its rewritten companions; re-read, it is the plan and trains on the same data per step."""
    path = HERE / entry["path"]
    code, out, err, folder, hw = _fit(entry, tmp_path, monkeypatch, capsys)
    if entry["fit"].startswith("error: "):
        _one_line_error(err, code, entry["fit"][len("error: "):])
        return
    assert code == 0, err
    assert ("nothing written" in out) == (entry["fit"] == "fits"), out
    assert folder.exists() == (entry["fit"] == "wrote"), out
    if entry["fit"] == "wrote":
        written, = folder.rglob(path.name)
        _reads_back_as_the_plan(entry, written, out, capsys, hw)
        per_gpu = _data(read_config(written), 1), _data(read_config(path), 1)  # the launcher's GPU count stays
        assert per_gpu[0] == per_gpu[1], per_gpu


# --- the property: fit never changes the data of a step unless --allow names it --------------------------------

WRITABLE = [e for e in CONFIGS if e["estimate"] == "ok" and not e["fit"].startswith("error: ")]
HARDWARE = [("rtx4090", 4), ("a100-80gb", 8), ("a100-40gb", 2), ("rtx4090", 8), ("rtx3090", 1)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(WRITABLE), hw=st.sampled_from(HARDWARE), allow=st.sampled_from(["", "lora", "8bit"]))
def test_fit_keeps_global_batch_packing_and_length_over_the_corpus(entry, hw, allow, tmp_path_factory, monkeypatch,
                                                                     capsys):
    path, gpus = HERE / entry["path"], hw[1]
    tmp = tmp_path_factory.mktemp("fit")
    try:
        before = read_config(path, gpus=gpus)
    except Exception:  # noqa: BLE001 - the file's own batch disagrees with this GPU count (DeepSpeed refuses it too)
        return
    code, _, _, folder, _ = _fit(entry, tmp, monkeypatch, capsys, *(["--allow", allow] if allow else []),
                           hw=_hw(entry, *hw))
    if code != 0 or not (folder / path.name).exists():
        return  # nothing the file can say fits (one line, nothing written), it fits already, or a code edit only
    assert _data(read_config(folder / path.name, gpus=gpus), gpus) == _data(before, gpus)


# --- what the corpus found in the launch reader (formats/launch.py, launch_merge.py) --------------------------

def _argv(text: str, cwd: Path = HERE) -> list:
    from memfit.interfaces.formats.launch_shell import commands_of

    return [(c.argv, c.cwd) for c in commands_of(text, "t.sh", cwd)]


def test_cd_above_the_scripts_folder_is_followed():
    """Qwen's finetune/*.sh run from the repository root: `cd "$(dirname "$0")/.."` says so."""
    (argv, cwd), = _argv('cd "$(dirname "$0")/.."\npython finetune.py --x 1\n', HERE / "corpus" / "qwen" / "finetune")
    assert cwd == HERE / "corpus" / "qwen" and argv[0] == "python"
    (_, same), = _argv('cd "$(dirname "$0")"\npython a.py\n')
    assert same == HERE


def test_a_backslash_newline_inside_double_quotes_is_dropped_as_bash_does():
    (argv, _), = _argv('ARGS="\n    --nproc_per_node 4 \\\n    --nnodes 1\n"\ntorchrun $ARGS finetune.py --bf16 True\n')
    assert "\\" not in argv and argv[:5] == ["torchrun", "--nproc_per_node", "4", "--nnodes", "1"]


def test_an_option_loops_positional_assignment_keeps_the_default():
    """The script read as run without arguments: `MODEL=$1` inside `while [[ "$1" != "" ]]` never runs."""
    (argv, _), = _argv('MODEL="Qwen/Qwen-7B"\nMODEL=$1\nOUT=$1\npython a.py --m $MODEL --o $OUT\n')
    assert argv[-3:] == ["Qwen/Qwen-7B", "--o", "$1"]  # OUT had no value before: it stays as typed


def test_fsdp_activation_checkpointing_off_leaves_the_scripts_gradient_checkpointing():
    """TRL's fsdp2.yaml (fsdp_activation_checkpointing: false) with `sft.py --gradient_checkpointing`: no conflict,
    the Trainer checkpoints (transformers refuses only both on)."""
    run = read_config(HERE / "corpus" / "trl" / "sft_fsdp2.sh")
    assert run.knobs["engine"] == "fsdp" and run.knobs["checkpointing"] == "full"
