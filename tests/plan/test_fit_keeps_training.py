"""`memfit fit` keeps the training the same (issue 12 B): the global batch, packing and the sequence length stay
unless --allow names them, a run that fits is left alone, the search runs on to the fastest plan the file can
say, paths it writes resolve as the framework resolves them, and what it writes reads back as the plan."""
import contextlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cards
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config

EXAMPLES = Path(__file__).resolve().parents[1] / "formats" / "examples"
LLAMA3 = "meta-llama/Meta-Llama-3-8B"
RTX4 = ["--gpu", "rtx4090", "--gpus", "4"]


def _copy(tmp_path: Path, relative: str) -> Path:
    """The example's folder tree under tmp_path (LLaMA-Factory YAMLs name their DeepSpeed file from the repo root)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path / "examples" / relative


def _plan_line(out: str) -> tuple[str, float]:
    m = re.search(r"-> (\w+) \(([\d.]+) GiB", out)
    assert m, out
    return m.group(1), float(m.group(2))


def _reads_back_as_the_plan(capsys, written: Path, out: str, hw: list[str], model: list[str]) -> None:
    """`memfit estimate --from` on the written file (as the framework would find its files) agrees with the plan."""
    verdict, gib = _plan_line(out)
    assert main(["estimate", *model, "--from", str(written), *hw, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == verdict == "fits"
    assert abs(doc["per_rank"]["device_total"]["peak_bytes"] / 2**30 - gib) < 0.02 * 24


# a bare DeepSpeed JSON can say only engine settings, an accelerate config only the engine: on a card where such a
# change fits and the file as written does not (tests/cards.py), instead of the real card, where none fits
OFFLOAD = {"offload_optimizer": "cpu", "offload_param": "cpu"}
FSDP = {"engine": "fsdp", "fsdp_strategy": "full_shard"}


def _card(path: Path, model: list[str], hw: list[str], change: dict | None) -> list[str]:
    """The hardware words, with a card derived for `change` when the test needs one."""
    if change is None:
        return hw
    run = cards.from_file(str(path), model=model[0] if model else None, gpu=hw[1], gpus_per_node=int(hw[3]))
    return hw + cards.gpu_mem(cards.card(run, change))


@pytest.mark.parametrize("relative, model, hw, change", [
    ("llamafactory/examples/deepspeed/ds_z3_config.json", [LLAMA3], RTX4, OFFLOAD),  # was: "deepspeed can express" none
    ("llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml", [], ["--gpu", "rtx4090", "--gpus", "7"], None),
    ("openrlhf/qwen2_7b_4x4090_z3.sh", [], RTX4, None),
    ("accelerate/multi_gpu.yaml", [LLAMA3], RTX4, FSDP),
    ("hf/sft_config.yaml", [], RTX4, None),
])
def test_every_format_reads_back_as_the_plan(tmp_path, monkeypatch, capsys, relative, model, hw, change):
    path = _copy(tmp_path, relative)
    monkeypatch.chdir(tmp_path)  # the launch folder: LLaMA-Factory / HF / accelerate open named files from here
    fit_model = ["--model", model[0]] if model else []
    hw = _card(path, model, hw, change)
    assert main(["fit", str(path), *fit_model, *hw, "--out", "out"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out
    _reads_back_as_the_plan(capsys, tmp_path / "out" / path.name, out, hw, model)


def test_a_run_that_fits_is_left_alone(tmp_path, capsys):
    path = EXAMPLES / "llamafactory/examples/train_lora/llama3_lora_sft.yaml"
    assert main(["fit", str(path), "--gpu", "a100-80gb", "--gpus", "8", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llama3_lora_sft.yaml: fits") and "nothing written" in out
    assert not (tmp_path / "out").exists()


def test_packing_only_when_allowed(tmp_path, capsys):
    """Two padded rows per micro-batch: the fastest plan packs them (a speed gain beyond the tie band), which puts
    other data in each step. The card: where the optimizer offload fits and micro-batch 1 alone does not."""
    path = EXAMPLES / "openrlhf/train_sft_llama_v0.8.sh"
    run = cards.from_file(str(path), gpu="a100-80gb", gpus_per_node=8)
    assert run.micro_batch > 1 and run.padding == "padded"
    capacity = cards.card(run, {"offload_optimizer": "cpu"},
                          not_enough=({"micro_batch": 1, "grad_accum": run.micro_batch * run.grad_accum},))
    hw = ["--gpu", "a100-80gb", "--gpus", "8", *cards.gpu_mem(capacity)]
    assert main(["fit", str(path), *hw, "--out", str(tmp_path / "kept")]) == 0
    assert "padding:" not in capsys.readouterr().out
    kept = tmp_path / "kept" / path.name
    assert not kept.exists() or read_config(kept, gpus=8).knobs["padding"] == "padded"
    assert main(["fit", str(path), *hw, "--allow", "packing", "--out", str(tmp_path / "packed")]) == 0
    assert "padding: padded ->" in capsys.readouterr().out
    packed = tmp_path / "packed" / path.name
    assert "--packing_samples" in packed.read_text() and read_config(packed, gpus=8).knobs["padding"] != "padded"


def test_a_plan_whose_file_would_drop_the_accumulation_is_passed_over(tmp_path, capsys):
    """accelerate's config holds gradient_accumulation_steps only in its deepspeed_config: rewritten for FSDP it
    would lose it (4 x fewer rows per step). Such a plan is refused and the next one written."""
    path = EXAMPLES / "accelerate/deepspeed_zero2_offload.yaml"
    hw = ["--gpu", "a100-40gb", "--gpus", "2"]
    assert main(["fit", str(path), "--model", LLAMA3, *hw, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sharding: zero2 -> fsdp" not in out
    written = tmp_path / path.name
    if written.exists():
        assert _data(read_config(written, gpus=2).knobs, 2) == _data(read_config(path, gpus=2).knobs, 2)


def test_allow_seq_is_refused_with_what_to_use(capsys):
    assert main(["fit", str(EXAMPLES / "openrlhf/one_line.txt"), *RTX4, "--allow", "seq"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--max-seq" in err


def test_a_bare_deepspeed_file_gets_the_fastest_plan_it_can_say(tmp_path, capsys):
    """Flash attention cannot be said in a DeepSpeed JSON: the search runs on without it, and says what a
    faster plan would need elsewhere."""
    path = EXAMPLES / "llamafactory/examples/deepspeed/ds_z3_config.json"
    assert main(["fit", str(path), "--model", LLAMA3, *_card(path, [LLAMA3], RTX4, OFFLOAD), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith("  attention:") for line in out.splitlines())  # not a change it can write
    assert "cannot say" in out and "attention sdpa -> flash" in out


def test_a_new_deepspeed_path_resolves_from_the_working_directory(tmp_path, monkeypatch, capsys):
    """LLaMA-Factory opens `deepspeed:` from where it is launched, not from the YAML's folder."""
    path = _copy(tmp_path, "llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml")
    launch = tmp_path / "launch"
    launch.mkdir()
    monkeypatch.chdir(launch)
    hw = ["--gpu", "rtx4090", "--gpus", "7"]
    assert main(["fit", str(path), *hw, "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    written = yaml.safe_load((tmp_path / "out" / path.name).read_text())
    if "deepspeed" in written:  # the plan needs DeepSpeed
        named = launch / written["deepspeed"]
        assert named.resolve().parent == (tmp_path / "out").resolve() and named.exists()
    # in place: the new file beside the YAML, named from the launch folder
    from memfit.interfaces.formats import write_config_files

    files = write_config_files(read_config(path, gpus=7), {"zero_stage": 3})
    value = yaml.safe_load(files[0].new_text)["deepspeed"]
    assert (launch / value).resolve() == files[1].path.resolve()


def test_an_edited_deepspeed_file_written_elsewhere_is_the_one_named(tmp_path, monkeypatch, capsys):
    """--out: the YAML must name the rewritten DeepSpeed JSON in --out, not the unchanged original."""
    from memfit.interfaces.formats import write_config_files

    path = _copy(tmp_path, "llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml")
    monkeypatch.chdir(tmp_path)
    imported = read_config(path, gpus=4)
    files = write_config_files(imported, {"offload_optimizer": "cpu"}, tmp_path / "out")
    assert files[1].path == tmp_path / "out" / "ds_z3_config.json"
    value = yaml.safe_load(files[0].new_text)["deepspeed"]
    assert (tmp_path / value).resolve() == files[1].path.resolve()


# --- the property: over the example files, fit never changes the data of a step ---------------------------

FILES = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.is_file())
HARDWARE = [["--gpu", "rtx4090", "--gpus", "4"], ["--gpu", "a100-80gb", "--gpus", "8"],
            ["--gpu", "a100-40gb", "--gpus", "2"], ["--gpu", "rtx4090", "--gpus", "8"]]


def _data(knobs: dict, gpus: int) -> tuple:
    return knobs.get("micro_batch", 1) * knobs.get("grad_accum", 1) * gpus, knobs.get("padding"), knobs.get("seq_len")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(relative=st.sampled_from(FILES), hw=st.sampled_from(HARDWARE), tuning=st.sampled_from(["", "lora", "8bit"]))
def test_fit_never_changes_the_global_batch_packing_or_length(tmp_path_factory, relative, hw, tuning):
    tmp = tmp_path_factory.mktemp("fit")
    path = EXAMPLES / relative
    gpus = int(hw[3])
    try:
        before = read_config(path, gpus=gpus)
    except Exception:
        return  # a file that disagrees with this GPU count (DeepSpeed's train_batch_size): fit refuses it too
    model = [] if before.model_name else ["--model", LLAMA3]
    allow = ["--allow", tuning] if tuning else []
    with contextlib.chdir(EXAMPLES / Path(relative).parts[0]):  # the launch folder the files' own paths name
        if main(["fit", str(path), *model, *hw, *allow, "--out", str(tmp)]) != 0:
            return  # nothing the file can say fits: an error line, nothing written
        written = tmp / path.name
        if not written.exists():
            return  # it fits already, or only a code edit changes
        after = read_config(written, gpus=gpus)
    assert _data(after.knobs, gpus) == _data(before.knobs, gpus)
