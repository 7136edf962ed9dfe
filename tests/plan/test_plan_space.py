"""The planner's space covers what practitioners do to fit a large model with adapters: the frozen weights
offloaded to the CPU (FSDP's CPU offload, ZeRO-3's parameter offload), the well-known 70B LoRA / QLoRA on two
24 GB cards among them. Each row found is re-estimated on its own and fits."""
from __future__ import annotations

import json

from memfit.interfaces.cli.main import main

SEVENTY = ["llama3.1-70b", "--tuning", "lora", "--seq", "2048"]


def _rows(argv, capsys) -> list[dict]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["rows"]


def _offloads_weights(config: dict) -> bool:
    return bool(config["fsdp_cpu_offload"]) or config["offload_param"] == "cpu"


def test_seventy_b_with_adapters_fits_two_24_gb_cards_by_offloading_the_frozen_weights(capsys):
    rows = _rows([*SEVENTY, "--gpu", "rtx4090", "--gpus", "2", "--allow", "qlora"], capsys)
    assert rows and all(r["verdict"] == "fits" for r in rows)
    assert all(_offloads_weights(r["config"]) for r in rows)  # nothing else fits 140 GB of bf16 weights in 48 GB
    engines = {r["config"]["engine"] for r in rows}
    assert "fsdp" in engines  # FSDP's CPU offload with adapters, the setup people search for


def test_each_found_row_fits_when_estimated_alone(capsys):
    rows = _rows([*SEVENTY, "--gpu", "rtx4090", "--gpus", "2", "--allow", "qlora"], capsys)
    for r in rows:
        c = r["config"]
        argv = ["estimate", "llama3.1-70b", "--gpu", "rtx4090", "--gpus-per-node", "2", "--seq-len", "2048",
                "--tuning", c["tuning"], "--micro-batch", str(c["micro_batch"]), "--attention", c["attention"],
                "--checkpointing", c["checkpointing"], "--loss", c["loss"], "--json"]
        if c["engine"] == "fsdp":
            argv += ["--fsdp", c["fsdp_strategy"]] + (["--fsdp-offload"] if c["fsdp_cpu_offload"] else [])
        else:
            argv += ["--zero-stage", str(c["zero_stage"]), "--offload-optimizer", c["offload_optimizer"],
                     "--offload-param", c["offload_param"]]
        if c["checkpointing"] == "every_n":
            argv += ["--checkpoint-every-n", str(c["checkpoint_every_n"])]
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["verdict"] == "fits", argv


def test_seventy_b_lora_on_eight_h100_lists_several_approaches(capsys):
    rows = _rows([*SEVENTY, "--gpu", "h100-80gb", "--gpus", "8", "--top", "10"], capsys)
    kinds = {(r["config"]["engine"], _offloads_weights(r["config"])) for r in rows}
    assert len(rows) >= 3 and len(kinds) >= 3
