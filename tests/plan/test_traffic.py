"""tools/count_traffic.py: the element-wise bytes of a decoder layer, counted in the real transformers / PEFT step."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import count_traffic as traffic  # noqa: E402
from count_traffic import TrafficCounter, layer_traffic, scenario  # noqa: E402


def test_the_counter_adds_elementwise_bytes_and_skips_matmuls_views_and_allocations():
    x, y, w = torch.ones(1000, dtype=torch.bfloat16), torch.ones(1000, dtype=torch.bfloat16), torch.ones(1000, 8)
    counter = TrafficCounter()
    with counter:
        x + y  # reads 2 x 2000 B, writes 2000 B
        x.view(10, 100)
        torch.empty(5000)
        x.float().reshape(1, 1000) @ w  # the cast reads 2000 B and writes 4000 B; the matmul is FLOPs
        x.add_(y)  # in place: reads both, writes x's own bytes, counted once with the inputs
    assert counter.bytes == {"forward": 6000 + 6000 + 4000}


def test_the_bytes_are_per_token_and_per_layer(monkeypatch):
    """The double difference leaves only what grows with layers x tokens: another token pair gives the same."""
    s = scenario(tuning="qlora", kbit_upcast=True)
    first = layer_traffic(s)
    monkeypatch.setattr(traffic, "TOKENS", (64, 192))
    assert layer_traffic(s) == first


def test_what_the_code_adds_shows_in_the_count():
    counted = traffic.derived()
    for kind in ("lora", "qlora"):
        for bits in (16, 32):
            few, every = counted[f"{kind}-{bits}"], counted[f"{kind}-{bits}-all"]
            dropout = counted[f"{kind}-{bits}-dropout"]
            assert every.forward > few.forward and every.backward > few.backward  # more adapted Linears
            assert dropout.forward > few.forward  # PEFT's dropout over the adapter input
        # an fp32 residual stream (PEFT's k-bit upcast, fp32 weights under autocast) moves more bytes
        assert counted[f"{kind}-32"].backward > counted[f"{kind}-16"].backward
    assert counted["full-16"].forward < counted["qlora-16"].forward < counted["lora-16"].forward


def test_the_shipped_rows_are_what_the_installed_libraries_count(capsys):
    assert traffic.main(["--check"]) == 0, capsys.readouterr().out
