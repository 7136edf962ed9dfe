"""bench/accuracy.py's framework groups: the litgpt / torchtune profiles against their own code's kept traces."""
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

pytest.importorskip("torch")  # the torchtune rows' scenarios come from memfit/trace/torchtune.py

import framework_paths  # noqa: E402


def _model_code(profile: str) -> dict:
    return tomllib.loads((ROOT / "memfit" / "facts" / "data" / "frameworks" / f"{profile}.toml").read_text())["model_code"]


@pytest.mark.parametrize("name, group", [("litgpt", framework_paths.litgpt_group),
                                         ("torchtune", framework_paths.torchtune_group),
                                         ("torchtune", framework_paths.torchtune_distributed_group)],
                         ids=["litgpt", "torchtune", "torchtune-distributed"])
def test_each_framework_path_is_within_5_percent_of_its_own_code(name, group):
    g = group()
    assert g["rows"] >= 8, g
    assert g["max_abs_pct_error"] <= 5.0, g
    assert g["versions"][name] == _model_code(name)[name], "the kept traces are of another release: re-trace them"


def test_qwen1_is_within_5_percent_of_its_own_modeling_file():
    from memfit.facts.remote_code import remote_code

    g = framework_paths.qwen1_group()
    assert g["rows"] >= 8 and g["max_abs_pct_error"] <= 5.0, g
    traced = remote_code("qwen")["traced"]  # the kept traces and the shipped facts come from the same libraries
    assert g["versions"]["transformers"] == traced["transformers"], "re-trace: python bench/qwen1.py --trace"


def test_glm4_is_within_5_percent_of_its_own_modeling_file():
    from memfit.facts.remote_code import remote_code

    g = framework_paths.glm4_group()
    assert g["rows"] >= 8 and g["max_abs_pct_error"] <= 5.0, g
    assert g["versions"]["transformers"] == remote_code("chatglm")["traced"]["transformers"], \
        "re-trace: python bench/glm4.py --trace"


def test_hf_trainer_fsdp_is_within_5_percent_of_accelerate_run_on_2_ranks():
    g = framework_paths.accelerate_fsdp_group()
    assert g["rows"] >= 14 and g["median_abs_pct_error"] <= 1.0 and g["max_abs_pct_error"] <= 5.0, g


def test_verl_is_within_5_percent_of_its_own_engine_on_2_ranks():
    g = framework_paths.verl_workers_group()
    assert g["rows"] >= 4 and g["max_abs_pct_error"] <= 5.0, g
    assert g["versions"]["verl"] == "0.9.1", "re-measure: python bench/verl_workers.py --save"


def test_accuracy_reports_the_framework_groups():
    import accuracy

    groups = accuracy.group_summaries([])
    assert {"framework:litgpt", "framework:torchtune", "framework:torchtune-distributed",
            "framework:qwen1", "framework:glm4", "framework:hf-trainer-fsdp", "framework:verl"} <= set(groups)
