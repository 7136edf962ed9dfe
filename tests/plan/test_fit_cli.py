"""`memfit fit` and `memfit estimate --from`: the user's own file in, the same format out, and it fits."""
from pathlib import Path

from memfit.cli import main
from memfit.formats import read_config

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
