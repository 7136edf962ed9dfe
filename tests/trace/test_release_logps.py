"""The log-prob counts of older TRL releases in data/methods.toml are what their ops hold when run."""
import pytest

pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")

from memfit.facts.methods import logits_facts
from memfit.facts.versions import pinned
from memfit.trace.release_logps import KINDS, traced_counts


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_methods_table_matches_the_traced_ops(kind):
    table = logits_facts(kind)
    assert table["torch"] == pinned()["torch"]  # traced on the pinned torch
    for point, copies in traced_counts(kind).items():
        for dtype, count in copies.items():
            assert table.get(f"{point}_{dtype}", 0) == count, f"{kind} {point}_{dtype}: table vs trace"


def test_the_fp32_logits_of_old_transformers_cost_more_than_16_bit_ones():
    fp32, lowp = traced_counts("trl_log_softmax_fp32"), traced_counts("trl_log_softmax")
    # the same ops: each 16-bit copy became an fp32 one
    assert fp32["saved"]["fp32"] == lowp["saved"]["lowp"] > 0 and fp32["saved"]["lowp"] == 0
