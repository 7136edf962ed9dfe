"""`memfit estimate --profile torchtune` against a trace of torchtune's own model and recipe step.

torchtune lives in its own venv (tests/trace/setup_torchtune_venv.sh; .ci/run builds it, as it builds the
LLaMA-Factory one for tests/formats): the trace runs there in a subprocess (`python -m memfit.trace.torchtune`),
the estimate here, on the same Scenario.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.facts.frameworks import framework
from memfit.roles.estimate import estimate

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("MEMFIT_TORCHTUNE_VENV", ROOT / ".venvs" / "torchtune"))
TOLERANCE_PCT = 5.0  # the brief for the torchtune profile: within 5% of the trace
SMALL = "meta-llama/Llama-3.2-1B"
ROWS = [  # two decoder layers of Llama 3.2 1B (its 128k vocabulary keeps the loss terms large)
    [SMALL, {"tuning": "full", "checkpointing": "off", "micro_batch": 2, "seq_len": 512}, 2],
    [SMALL, {"tuning": "full", "checkpointing": "full", "micro_batch": 2, "seq_len": 512,
             "optimizer_in_backward": True}, 2],
    [SMALL, {"tuning": "lora", "checkpointing": "off", "micro_batch": 2, "seq_len": 512}, 2],
    [SMALL, {"tuning": "lora", "checkpointing": "full", "micro_batch": 2, "seq_len": 512,
             "lora_targets": ["q_proj", "v_proj"]}, 2],
]
# one decoder layer's saved activations: the 3-layer trace minus the 2-layer one (rows 0 and 2 above), where
# every fact of torchtune's layer code shows (no padding mask, k/v expanded to all heads, fp32 norm scaling)
LAYER_ROWS = {0: [*ROWS[0][:2], 3], 2: [*ROWS[2][:2], 3]}
LAYER_TOLERANCE_PCT = 0.5


def _venv_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no torchtune venv at {VENV}: bash tests/trace/setup_torchtune_venv.sh")
    return python


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(_venv_python()), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def traces():
    done = _run("-m", "memfit.trace.torchtune", json.dumps(ROWS + list(LAYER_ROWS.values())))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("index", range(len(ROWS)), ids=[f"{r[1]['tuning']}-ckpt-{r[1]['checkpointing']}"
                                                          + ("-in-bwd" if r[1].get("optimizer_in_backward") else "")
                                                          for r in ROWS])
def test_estimate_matches_the_torchtune_trace(traces, index):
    from memfit.trace.torchtune import scenario_of

    model, knobs, layers = ROWS[index]
    est = estimate(scenario_of(model, knobs, layers)).allocated
    predicted = est.peak.total - est.peak.get("runtime_overhead")  # the trace has no CUDA context / cuBLAS
    traced = traces[index]["profile"]["peak_bytes"]
    error = 100 * (predicted - traced) / traced
    assert abs(error) <= TOLERANCE_PCT, f"estimate {predicted:,} vs trace {traced:,} bytes: {error:+.2f}%"


def _forward_activations(profile: dict) -> int:
    return profile["phases"]["forward"]["activations"]


@pytest.mark.parametrize("index", sorted(LAYER_ROWS), ids=lambda i: ROWS[i][1]["tuning"])
def test_one_layers_saved_activations_match(traces, index):
    from memfit.trace.torchtune import scenario_of

    three = traces[len(ROWS) + sorted(LAYER_ROWS).index(index)]
    traced = _forward_activations(three["profile"]) - _forward_activations(traces[index]["profile"])
    est = [estimate(scenario_of(*row)).allocated.phases["forward"].get("activations")
           for row in (ROWS[index], LAYER_ROWS[index])]
    predicted = est[1] - est[0]
    error = 100 * (predicted - traced) / traced
    assert abs(error) <= LAYER_TOLERANCE_PCT, f"per layer: estimate {predicted:,} vs trace {traced:,}: {error:+.2f}%"


def test_shipped_facts_are_the_installed_torchtunes(traces):
    code = framework("torchtune").model_code
    assert traces[0]["torchtune"].split("+")[0] == code["torchtune"]
    done = _run("-c", "from importlib.metadata import version; print(version('torchao'))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().split("+")[0] == code["torchao"]


def test_measured_facts_rederive(traces):
    done = _run("-m", "memfit.trace.torchtune_facts", "--check")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("knobs, says", [
    ({"padding": "packed"}, "packed"),
    ({"checkpointing": "offload"}, "offloading"),
    ({"optimizer": "adamw-8bit"}, "bitsandbytes"),
])
def test_what_the_trace_cannot_run_is_one_line(knobs, says):
    from memfit.trace.torchtune import check_supported, scenario_of

    with pytest.raises(MemfitError, match=says):
        check_supported(scenario_of(SMALL, {"tuning": "full", **knobs}))


def test_partial_mlp_targets_are_refused():
    from memfit.trace.torchtune import lora_kwargs, scenario_of

    with pytest.raises(MemfitError, match="all of the MLP"):
        lora_kwargs(scenario_of(SMALL, {"tuning": "lora", "lora_targets": ["q_proj", "up_proj"]}))


def test_the_venv_script_installs_the_recorded_releases():
    code = framework("torchtune").model_code
    script = (ROOT / "tests" / "trace" / "setup_torchtune_venv.sh").read_text()
    assert f'torchtune=={code["torchtune"]}' in script
    assert f'torchao=={code["torchao"]}' in script


@pytest.mark.parametrize("rows, says", [("notjson", "expecting value"), ('[["nosuch", {"tuning": "lora"}, 2]]',
                                                                         "unknown model")])
def test_bad_rows_are_one_line(rows, says):
    done = _run("-m", "memfit.trace.torchtune", rows)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr.lower(), done.stderr
