"""axolotl YAML: the knobs of each example as read by hand from the file and axolotl's code, one-line errors for
bad files through the CLI, a result that does not depend on key order, and what `fit` writes reading back."""
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.interfaces.cli.main import main
from memfit.interfaces.formats import axolotl, detect_format, read_config, write_config_files

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
    code = main(["estimate", "--from", str(path), "--gpu", "a100-80gb", *extra])
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
    ("lora_dropout: 0.05", "lora_dropout: 0.05\nlora_modules_to_save: {embed_tokens: 1}", "lora_modules_to_save"),
    ("adapter: lora", "adapter: qlora\nload_in_8bit: true", "choose one"),
])
def test_bad_file_one_line(tmp_path, capsys, old, new, needle):
    assert old in LORA
    line = _cli(tmp_path, capsys, LORA.replace(old, new))
    assert "memfit: error:" in line and needle in line


def test_unknown_key_is_a_warning():
    got = read_config(LORA.replace("logging_steps: 1", "logging_steps: 1\nmy_note: hello"), format="axolotl")
    assert any("my_note" in w and "axolotl 0.18.0" in w for w in got.warnings)


def test_fit_writes_the_yaml_and_the_deepspeed_file_it_names(tmp_path, capsys, monkeypatch):
    """Full fine-tuning of an 8B on four RTX 4090s needs the optimizer on the host: the DeepSpeed file gets it, copied
    into --out, and the YAML names the copy as HF Trainer opens it (from the working directory)."""
    shutil.copytree(HERE, tmp_path / "ax")
    monkeypatch.chdir(tmp_path)
    code = main(["fit", "ax/fft-8b-zero3.yaml", "--model", "llama-3.1-8b", "--gpu", "rtx4090", "--gpus-per-node", "4",
                 "--out", "out"])
    assert code == 0, capsys.readouterr().err
    written = read_config(tmp_path / "out" / "fft-8b-zero3.yaml")
    assert written.doc["deepspeed"] == "out/zero3_bf16.json"
    assert written.knobs["offload_optimizer"] == "cpu"
    original, k = EXPECTED["fft-8b-zero3.yaml"], written.knobs
    assert k["micro_batch"] * k["grad_accum"] == original["micro_batch"] * original["grad_accum"]  # the global batch
    assert (k["seq_len"], k["padding"]) == (original["seq_len"], original["padding"])


# one change each, as the knob table's `says` column gives axolotl; each must read back as written
WRITES = [
    ("lora-1b.yml", {"tuning": "qlora"}), ("lora-1b.yml", {"tuning": "full"}),
    ("fft-8b-zero3.yaml", {"tuning": "lora", "lora_rank": 32, "lora_alpha": 16}),
    ("lora-1b.yml", {"lora_targets": ("all-linear",)}), ("lora-1b.yml", {"lora_targets": ("q_proj", "v_proj")}),
    ("lora-1b.yml", {"attention": "sdpa"}), ("fft-8b-zero3.yaml", {"attention": "eager"}),
    ("lora-1b.yml", {"checkpointing": "off"}), ("lora-1b.yml", {"checkpointing": "offload", "reentrant": False}),
    ("lora-1b.yml", {"precision": "fp16-pure"}), ("lora-1b.yml", {"precision": "fp32"}),
    ("lora-1b.yml", {"padding": "padded", "micro_batch": 4, "grad_accum": 1, "seq_len": 4096}),
    ("lora-1b.yml", {"optimizer": "adamw-foreach", "dora": True}),
    ("fft-8b-zero3.yaml", {"zero_stage": 2, "offload_optimizer": "cpu"}),
    ("lora-1b.yml", {"engine": "deepspeed", "zero_stage": 3}),
    ("lora-1b.yml", {"loss": "liger"}),
    ("lora-1b.yml", {"tuning": "qlora", "quant_bits": 8}), ("fft-8b-zero3.yaml", {"tuning": "qlora"}),
]


@pytest.mark.parametrize("name, changes", WRITES, ids=[f"{n}-{'-'.join(c)}" for n, c in WRITES])
def test_a_change_reads_back_as_written(name, changes, tmp_path, monkeypatch):
    shutil.copytree(HERE, tmp_path / "ax")
    monkeypatch.chdir(tmp_path / "ax")
    imported = read_config(Path(name))
    files = write_config_files(imported, {**imported.knobs, **changes}, folder=tmp_path / "out")
    for f in files:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        f.path.write_text(f.new_text)
    again = read_config(Path(files[0].path).relative_to(tmp_path / "ax") if files[0].path.is_relative_to(
        tmp_path / "ax") else files[0].path)
    assert {k: again.knobs.get(k) for k in changes} == changes
    untouched = {k: v for k, v in imported.knobs.items() if k not in changes and k in again.knobs}
    assert all(again.knobs[k] == v for k, v in untouched.items() if k not in ("reentrant", "lora_alpha", "lora_rank",
                                                                               "lora_targets", "lora_dropout"))


@pytest.mark.parametrize("name, changes, says", [
    ("qlora-fsdp-70b.yaml", {"micro_batch": 2}, "fsdp_config"),
    ("lora-1b.yml", {"precision": "bf16-mixed"}, "loaded dtype"),
    ("lora-1b.yml", {"checkpointing": "every_n"}, "true, false or offload"),
    ("lora-1b.yml", {"tuning": "ia3"}, "LoRA or QLoRA"),
])
def test_what_axolotl_cannot_say_is_one_line(name, changes, says):
    from memfit.errors import MemfitError

    imported = read_config(HERE / name)
    with pytest.raises(MemfitError, match=says) as err:
        write_config_files(imported, {**imported.knobs, **changes})
    assert "\n" not in str(err.value)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(EXPECTED)), st.randoms(use_true_random=False))
def test_key_order_does_not_matter(name, rnd):
    doc = yaml.safe_load((HERE / name).read_text())
    items = list(doc.items())
    rnd.shuffle(items)
    text = yaml.safe_dump(dict(items), sort_keys=False)
    got = axolotl.read(text, path=HERE / name)  # where the original is: its deepspeed: path resolves the same
    assert got.knobs == EXPECTED[name]


def test_a_fresh_file_reads_back_as_the_scenario(tmp_path, monkeypatch):
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware
    from memfit.interfaces.formats import export_scenario, knobs_from_scenario

    said = {"tuning": "qlora", "zero_stage": 3, "micro_batch": 2, "grad_accum": 4, "checkpointing": "full",
            "attention": "flash", "seq_len": 2048, "lora_rank": 16, "padding": "packed"}
    s = build_scenario(find_model("meta-llama/Llama-3.1-8B"), Hardware(gpu=find_gpu("rtx4090"), gpus_per_node=4),
                       said, "hf-trainer")
    monkeypatch.chdir(tmp_path)
    main_file, ds_file = export_scenario(s, "axolotl")
    Path(ds_file.path).write_text(ds_file.new_text)
    got = read_config(main_file.new_text, format="axolotl", gpus=4)
    expected = knobs_from_scenario(s)
    assert {k: got.knobs.get(k) for k in said} == {k: expected[k] for k in said}
