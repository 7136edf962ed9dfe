import os
import sys
import tempfile
from pathlib import Path

import pytest

from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware

# the benches' modules (shared_cases, published, ...) for the tests that check them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
# the planner's search stops at a wall-clock deadline; on a loaded machine that would change the plans tested
os.environ.setdefault("MEMFIT_PLAN_DEADLINE", "300")
# a machine profile of the developer's own (memfit calibrate --save) would change every estimate: none is read
os.environ.pop("MEMFIT_MACHINE", None)
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="memfit-tests-config-")  # chromium writes there too


@pytest.fixture
def scenario():
    """Build a Scenario the way the CLI does: model and GPU by name, knobs as the user says them."""

    def make(model="qwen2-7b-instruct", gpu="rtx4090", gpus=1, profile="hf-trainer", host_ram=None, **knobs):
        hw = Hardware(gpu=find_gpu(gpu), gpus_per_node=gpus, host_ram=host_ram)
        return build_scenario(find_model(model), hw, knobs, profile)

    return make
