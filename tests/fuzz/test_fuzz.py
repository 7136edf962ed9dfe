"""Property: whatever the input, memfit gives a result or one `memfit: error:` line (exit 2), never a
traceback or a hang. Deterministic (derandomize) and bounded so the folder runs in about a minute;
`python bench/fuzz.py --examples 2000` runs the same strategies longer."""
import pytest
from hypothesis import HealthCheck, given, settings

from fuzzing import TARGETS, warm_up


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_up()


def _fuzz(name: str):
    strategy, runner, examples = TARGETS[name]

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def test(case):
        outcome = runner(case)
        assert outcome.kind != "failure", f"{outcome.detail}\ninput: {outcome.input!r}"[:4000]

    test.__name__ = f"test_{name}_gives_a_result_or_one_error_line"
    return test


test_read_config = _fuzz("read_config")
test_model_config = _fuzz("model_config")
test_estimate_argv = _fuzz("estimate")
test_plan_argv = _fuzz("plan")
test_plan_limits_argv = _fuzz("plan_limits")
test_fit_argv = _fuzz("fit")
