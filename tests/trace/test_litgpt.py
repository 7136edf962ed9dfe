"""`memfit estimate --profile litgpt` agrees with LitGPT's own training step, traced in LitGPT's venv.

The venv (.venvs/litgpt, or $MEMFIT_LITGPT_VENV) is built by tests/trace/setup_litgpt_venv.sh when absent, as
tests/formats does for LLaMA-Factory's; building it needs the package index.
"""
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("litgpt_bench", ROOT / "bench" / "litgpt.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["litgpt_bench"] = bench  # bench/litgpt.py by path: the name `litgpt` is LitGPT's own package
_spec.loader.exec_module(bench)

FACTS = ROOT / "memfit" / "facts" / "data" / "frameworks" / "litgpt.toml"
TOLERANCE_PCT = 5.0
# short models, so the re-trace takes seconds: LoRA's chunked head and full tuning's unchunked one, the tied
# Llama-3.2 head that LitGPT unties, GQA k/v expanded by LitGPT's attention
RETRACED = [
    {"config": "Llama-3.2-1B", "method": "lora", "micro_batch": 2, "seq_len": 384, "n_layer": 2},
    {"config": "Llama-3.2-1B", "method": "full", "micro_batch": 1, "seq_len": 640, "n_layer": 1},
    # LLaMA-Adapter: the two layers below the first prompt save nothing (v1); v2 in LitGPT's default bf16-mixed
    {"config": "Llama-3.2-1B", "method": "adapter", "micro_batch": 2, "seq_len": 256, "n_layer": 4},
    {"config": "Llama-3.2-1B", "method": "adapter_v2", "micro_batch": 1, "seq_len": 384, "n_layer": 3,
     "precision": "bf16-mixed"},
]


@pytest.fixture(scope="module")
def venv_python() -> Path:
    return bench.venv_python()


@pytest.fixture(scope="module")
def retraced(venv_python) -> list[dict]:
    return bench.trace_runs(RETRACED)


def test_shipped_facts_were_traced_on_the_venvs_litgpt(venv_python):
    installed = subprocess.run([str(venv_python), "-c", "import importlib.metadata as m; print(m.version('litgpt'))"],
                               capture_output=True, text=True, check=True).stdout.strip()
    code = tomllib.loads(FACTS.read_text())["model_code"]
    assert code["litgpt"] == installed
    assert code["logits"]["litgpt"] == installed
    pinned = re.search(r'LITGPT="litgpt==([\d.]+)"', (ROOT / "tests" / "trace" / "setup_litgpt_venv.sh").read_text())
    assert pinned and pinned.group(1) == installed
    recorded = {entry["litgpt"] for entry in bench.cached_traces(bench.ROWS).values()}
    assert recorded == {installed}, f"bench/litgpt_traces.json traced on litgpt {recorded}: python bench/litgpt.py --retrace"


@pytest.mark.parametrize("index", range(len(RETRACED)))
def test_estimate_matches_a_fresh_litgpt_trace(retraced, index):
    run = RETRACED[index]
    row = bench.compare(run, retraced[index])
    assert abs(row.error_pct) <= TOLERANCE_PCT, f"{row.label}: estimate {row.estimate:,} vs trace {row.trace:,}"


def test_estimate_matches_the_benchs_litgpt_traces():
    """The full-size rows of bench/litgpt.py against their committed traces (no re-trace: the memory model's side)."""
    traces = bench.cached_traces(bench.ROWS)
    rows = [bench.compare(run, traces[bench._key(run)]) for run in bench.ROWS]
    worst = max(rows, key=lambda r: abs(r.error_pct))
    assert abs(worst.error_pct) <= TOLERANCE_PCT, f"{worst.label}: {worst.error_pct:+.1f}%"


def test_a_tied_head_is_untied_and_lora_takes_litgpts_defaults():
    s = bench.scenario({"config": "Llama-3.2-1B", "method": "lora", "seq_len": 256})
    assert not s.model.tie_embeddings
    assert (s.lora_rank, s.lora_targets, s.lora_dropout) == (8, ("q", "v"), 0.05)
    several = bench.scenario({"config": "Llama-3.2-1B", "method": "lora", "seq_len": 256, "devices": 2})
    assert (several.engine, several.checkpointing, several.reentrant) == ("fsdp", "full", False)


@pytest.mark.parametrize("index", [i for i, run in enumerate(RETRACED) if run["method"].startswith("adapter")])
def test_the_adapters_train_what_litgpt_marks_trainable(retraced, index):
    """memfit's inventory of LLaMA-Adapter v1 / v2 counts LitGPT's own trainable parameters; the v1 prompt, though
    marked trainable, is held frozen (fit()'s no-grad validation caches its k/v) and gets no gradient in the trace."""
    from memfit.memory.inventory import scenario_tensors

    s = bench.scenario(RETRACED[index])
    tensors = scenario_tensors(s)
    trained = sum(t.total for t in tensors if t.trainable)
    prompt = sum(t.total for t in tensors if t.module == "adapter_wte")
    assert prompt and not any(t.trainable for t in tensors if t.module == "adapter_wte")
    assert trained + prompt == retraced[index]["trainable"]
    width = 4 if s.frozen_fp32_in_module else 2  # gradients in the parameters' dtype
    grads = retraced[index]["marks"]["backward_end"].get("gradients", 0)
    assert grads - trained * width < prompt * width // 2, "the prompt got a gradient: LitGPT no longer reuses the " \
                                                          "validation's k/v cache"


@pytest.mark.parametrize("knobs, profile, says", [
    ({"tuning": "llama_adapter"}, "hf-trainer", "--profile litgpt"),
    ({"tuning": "llama_adapter_v2", "lora_dropout": 0.1}, "litgpt", "no input dropout"),
])
def test_llama_adapter_outside_litgpt_or_with_lora_knobs_is_one_line(knobs, profile, says):
    from memfit.errors import MemfitError
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    with pytest.raises(MemfitError, match=re.escape(says)) as err:
        build_scenario(find_model("meta-llama/Llama-3.2-1B"), Hardware(gpu=find_gpu("a100-80gb")), knobs, profile)
    assert "\n" not in str(err.value)


def test_llama_adapter_needs_a_layer_at_or_above_the_prompts_start():
    from dataclasses import replace

    from memfit.errors import MemfitError
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    short = replace(find_model("meta-llama/Llama-3.2-1B"), num_layers=2)
    with pytest.raises(MemfitError, match="none at or above"):
        build_scenario(short, Hardware(gpu=find_gpu("a100-80gb")), {"tuning": "llama_adapter"}, "litgpt")
    v2 = build_scenario(short, Hardware(gpu=find_gpu("a100-80gb")), {"tuning": "llama_adapter_v2"}, "litgpt")
    assert v2.tuning == "llama_adapter_v2"  # v2 trains the norms and Linear scales of every layer


@pytest.mark.parametrize("spec, says", [("notjson", "expecting value"),
                                        ('{"config": "NoSuch", "method": "lora"}', "not a supported config name"),
                                        ('{"config": "Llama-3.2-1B", "method": "prefix"}', "method")])
def test_a_bad_run_is_one_line(venv_python, spec, says):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([str(venv_python), "-m", "memfit.trace.litgpt"], input=spec, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr.lower(), done.stderr
