"""`memfit fit` and `memfit estimate --from`: the user's own file in, the same format out, and it fits."""
from pathlib import Path

import cards
from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import read_config

EXAMPLES = Path(__file__).resolve().parents[1] / "formats" / "examples"
QWEN_Z3 = EXAMPLES / "openrlhf" / "qwen2_7b_4x4090_z3.sh"
LLAMA_7X4090 = EXAMPLES / "llamafactory" / "examples" / "train_lora" / "llama31_8b_lora_7x4090.yaml"


def test_estimate_from_an_openrlhf_command_reads_its_knobs(capsys):
    assert main(["estimate", "--from", str(QWEN_Z3), "--gpu", "rtx4090", "--gpus", "4", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"verdict": "oom"' in out and "Qwen/Qwen2-7B" in out


def test_fit_rewrites_the_openrlhf_command_so_it_fits(tmp_path, capsys):
    assert main(["fit", str(QWEN_Z3), "--gpu", "rtx4090", "--gpus", "4", "--out", str(tmp_path)]) == 0
    written = (tmp_path / QWEN_Z3.name).read_text()
    assert "--adam_offload" in written  # the reported fix
    imported = read_config(tmp_path / QWEN_Z3.name, gpus=4)
    assert imported.knobs["offload_optimizer"] == "cpu"
    assert main(["estimate", "--from", str(tmp_path / QWEN_Z3.name), "--gpu", "rtx4090", "--gpus", "4",
                 "--json"]) == 0
    assert '"verdict": "oom"' not in capsys.readouterr().out.split("wrote")[-1]


def test_fit_rewrites_the_llamafactory_yaml_so_it_fits(tmp_path, capsys):
    assert main(["fit", str(LLAMA_7X4090), "--gpu", "rtx4090", "--gpus", "7", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.split("->")[0].split(": ")[1].startswith("oom")
    assert "-> fits" in first or "-> tight" in first
    assert list(tmp_path.iterdir())
    from memfit.interfaces.formats import validate

    if (validate.LLAMAFACTORY_VENV / "bin" / "python").exists():  # LLaMA-Factory's own parser on the result
        written = tmp_path / LLAMA_7X4090.name
        parsed = validate.validate_llamafactory(written.read_text(), tmp_path)
        assert parsed["finetuning_type"] == "lora"


QWEN72 = EXAMPLES / "openrlhf" / "qwen25_72b_offload.sh"
GLM_DPO = EXAMPLES / "openrlhf" / "glm4_9b_dpo_eager.sh"
A100_NODE = ["--gpu", "a100-80gb", "--gpus", "8"]


def _openrlhf_parses(path, gpus=8):
    """OpenRLHF's own argparse (rebuilt from the released wheel) on what memfit wrote; None if no wheels."""
    from memfit.interfaces.formats import openrlhf as orl
    from memfit.interfaces.formats import validate_openrlhf

    imported = read_config(path, gpus=gpus)
    try:
        validate_openrlhf.openrlhf_source(imported.variant, imported.doc.script)
    except Exception:  # no network to the package index and no cached wheel
        return None
    return vars(validate_openrlhf.validate_openrlhf(orl.arguments(imported), imported.variant, imported.doc.script))


def test_fit_writes_the_openrlhf_command_and_the_code_edit_beside_it(tmp_path, capsys):
    """report-qwen25-72b-offload-pinned: the fix is an edit of get_train_ds_config, not a flag. The command
    stays a command OpenRLHF parses; the edit is written as its own file with the exact lines."""
    assert main(["fit", str(QWEN72), *A100_NODE, "--host-ram", "1.4TB", "--no-resume", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NEEDS A CODE EDIT" in out and "CODE EDIT: no flag" in out
    edit = (tmp_path / f"{QWEN72.name}.code-edit.txt").read_text()
    assert "openrlhf/utils/deepspeed/deepspeed_utils.py" in edit and "get_train_ds_config()" in edit
    lines = [line.strip() for line in edit.splitlines() if line.startswith("    ")]
    assert lines and all(line.startswith('zero_opt_dict["') for line in lines)
    command = tmp_path / QWEN72.name
    if command.exists():  # the plan may also change flags (micro-batch, packing)
        text = command.read_text()
        assert "pin_memory" not in text and "ratio" not in text
        args = _openrlhf_parses(command)
        assert args is None or args["adam_offload"] and args["zero_stage"] == 3


def test_fit_for_a_run_that_resumes_moves_optimizer_sub_groups_to_the_gpus(tmp_path, capsys):
    """report-qwen25-72b-offload-unpinned-resume: the resume needs `ratio` < 1 (the maintainers' fix was 0.9)."""
    assert main(["fit", str(QWEN72), *A100_NODE, "--host-ram", "1.4TB", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    edit = (tmp_path / f"{QWEN72.name}.code-edit.txt").read_text()
    ratio = [line for line in edit.splitlines() if line.strip().startswith('zero_opt_dict["offload_optimizer"]["ratio"]')]
    assert ratio and float(ratio[0].split("=")[1]) < 1


def test_fit_rewrites_an_openrlhf_dpo_command_with_flash_attention(tmp_path, capsys):
    """The GLM-4 DPO report (issue 12): eager attention at 2048 tokens runs out of memory (GLM-4's own file leaves
    --gradient_checkpointing off); flash fits."""
    assert main(["fit", str(GLM_DPO), *A100_NODE, "--out", str(tmp_path)]) == 0
    written = tmp_path / GLM_DPO.name
    assert "--attn_implementation flash_attention_2" in written.read_text()
    args = _openrlhf_parses(written)
    assert args is None or (args["attn_implementation"] == "flash_attention_2" and args["zero_stage"] == 3)
    capsys.readouterr()
    assert main(["estimate", "--from", str(written), *A100_NODE, "--json"]) == 0
    assert '"verdict": "oom"' not in capsys.readouterr().out


def test_fit_again_into_the_same_out_folder_keeps_the_file_it_created_there(tmp_path, capsys):
    """A plan that needs a new DeepSpeed JSON writes it into --out; a second fit there finds it, not the user's.
    The card: where ZeRO-2 with optimizer offload fits and ZeRO-2 alone does not (FSDP2's own offload fits there
    too, far slower: the plan takes the DeepSpeed file)."""
    v1 = Path(__file__).resolve().parents[1] / "formats" / "llamafactory_v1_examples" / "freeze_sft.yaml"
    zero2 = {"engine": "deepspeed", "zero_stage": 2}
    capacity = cards.card(cards.from_file(str(v1), gpu_mem="80GiB"), zero2 | {"offload_optimizer": "cpu"},
                          not_enough=(zero2,))
    args = ["fit", str(v1), *cards.gpu_mem(capacity), "--out", str(tmp_path)]
    assert main(args) == 0
    created = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    assert created, capsys.readouterr().out
    before = {p: p.read_text() for p in tmp_path.iterdir()}
    assert main(args) == 0, capsys.readouterr().err
    assert "already holds this" in capsys.readouterr().out
    assert {p: p.read_text() for p in tmp_path.iterdir()} == before
