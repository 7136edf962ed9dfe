"""axolotl YAML: the knobs of each example as read by hand from the file and axolotl's code, one-line errors for
bad files through the CLI, and a result that does not depend on key order."""
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import axolotl, detect_format, read_config

HERE = Path(__file__).parent / "axolotl_examples"

# Read by hand: bf16 auto/true -> the model loads in bf16 and trains those weights (resolve_dtype); checkpointing
# without kwargs is reentrant (normalize_config); lora_target_linear -> every linear layer.
EXPECTED = {
    "lora-1b.yml": {"method": "sft", "tuning": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                    "lora_targets": ("q_proj", "k_proj", "v_proj", "o_proj"), "precision": "bf16-pure",
                    "checkpointing": "full", "reentrant": True, "attention": "flash", "padding": "packed",
                    "seq_len": 2048, "micro_batch": 2, "grad_accum": 2, "optimizer": "adamw-8bit"},
    "qlora-fsdp-70b.yaml": {"method": "sft", "tuning": "qlora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.05,
                            "lora_targets": ("all-linear",), "precision": "bf16-pure", "checkpointing": "full",
                            "reentrant": True, "attention": "sdpa", "padding": "padded", "seq_len": 512,
                            "micro_batch": 1, "grad_accum": 4, "optimizer": "adamw-fused", "engine": "fsdp",
                            "fsdp_strategy": "full_shard", "fsdp_cpu_offload": True,
                            "fsdp_cpu_ram_efficient_loading": True},
    "fft-8b-zero3.yaml": {"method": "sft", "tuning": "full", "precision": "bf16-pure", "checkpointing": "offload",
                          "reentrant": True, "attention": "flash", "padding": "packed", "seq_len": 8192,
                          "micro_batch": 1, "grad_accum": 8, "optimizer": "paged-adamw-8bit", "engine": "deepspeed",
                          "zero_stage": 3, "offload_optimizer": "none", "offload_param": "none",
                          "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 0},
    "fft-8b-liger-fsdp2.yaml": {"method": "sft", "tuning": "full", "precision": "bf16-pure", "checkpointing": "full",
                                "reentrant": False, "attention": "flash", "padding": "packed", "seq_len": 4096,
                                "micro_batch": 2, "grad_accum": 4, "optimizer": "adamw-fused", "loss": "liger",
                                "engine": "fsdp", "fsdp_strategy": "full_shard", "fsdp_cpu_offload": False,
                                "fsdp_cpu_ram_efficient_loading": True},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_knobs(name):
    path = HERE / name
    assert detect_format(path.read_text(), name) == "axolotl"
    got = read_config(path, gpus=8)
    assert got.format == "axolotl"
    assert got.knobs == EXPECTED[name]
    assert got.model_name == yaml.safe_load(path.read_text())["base_model"]


def test_liger_kernels_named_and_deepspeed_companion():
    liger = read_config(HERE / "fft-8b-liger-fsdp2.yaml")
    assert [w.split(": ")[1].split("=")[0] for w in liger.warnings] == ["liger_rope", "liger_rms_norm",
                                                                       "liger_glu_activation"]
    assert "deepspeed" in read_config(HERE / "fft-8b-zero3.yaml").companions


def test_other_formats_not_taken():
    """The shipped examples of the other formats keep their format."""
    from format_cases import EXAMPLES
    for path in EXAMPLES.rglob("*.y*ml"):
        assert detect_format(path.read_text(), path.name) != "axolotl", path


def _cli(tmp_path, capsys, text, *extra):
    shutil.copytree(HERE, tmp_path / "ax")
    path = tmp_path / "ax" / "bad.yaml"
    path.write_text(text)
    code = main(["estimate", "--from", str(path), "--gpu", "a100", *extra])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


LORA = (HERE / "lora-1b.yml").read_text()


@pytest.mark.parametrize("old, new, needle", [
    ("micro_batch_size: 2", "micro_batch_size: two", "micro_batch_size"),
    ("sample_packing: true", "sample_packing: [1]", "sample_packing"),
    ("adapter: lora", "adapter: prefix", "adapter"),
    ("gradient_checkpointing: true", "gradient_checkpointing: sometimes", "gradient_checkpointing"),
    ("optimizer: adamw_8bit", "optimizer: came_pytorch", "optimizer"),
    ("bf16: auto", "deepspeed: deepspeed_configs/missing.json", "no such file"),
    ("lora_dropout: 0.05", "lora_dropout: 0.05\nmicro_batch_sizes: 4", "looks like a memory setting"),
])
def test_bad_file_one_line(tmp_path, capsys, old, new, needle):
    assert old in LORA
    line = _cli(tmp_path, capsys, LORA.replace(old, new))
    assert "memfit: error:" in line and needle in line


def test_unknown_key_is_a_warning():
    got = read_config(LORA.replace("logging_steps: 1", "logging_steps: 1\nmy_note: hello"), format="axolotl")
    assert any("my_note" in w and "axolotl 0.18.0" in w for w in got.warnings)


def test_fit_refuses_writing(tmp_path, capsys):
    shutil.copytree(HERE, tmp_path / "ax")
    code = main(["fit", str(tmp_path / "ax" / "fft-8b-zero3.yaml"), "--model", "llama-3.1-8b", "--gpu", "rtx4090",
                 "--gpus-per-node", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "axolotl" in err[0], err


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(EXPECTED)), st.randoms(use_true_random=False))
def test_key_order_does_not_matter(name, rnd):
    doc = yaml.safe_load((HERE / name).read_text())
    items = list(doc.items())
    rnd.shuffle(items)
    text = yaml.safe_dump(dict(items), sort_keys=False)
    got = axolotl.read(text, path=HERE / name)  # where the original is: its deepspeed: path resolves the same
    assert got.knobs == EXPECTED[name]
