"""`memfit estimate`'s speed lines and its "speed" JSON: the step time and tokens/s with their measured band, and,
given the data's size (--lengths DATA [--epochs E], or --tokens N) and optionally --price-per-gpu-hour, the
wall-clock and cost of the whole run. Registered by memfit/interfaces/cli/main.py."""
from __future__ import annotations

import argparse

from memfit.errors import MemfitError


def add_run_cost_arguments(p: argparse.ArgumentParser) -> None:
    from memfit.interfaces.cli.args import positive_int

    g = p.add_argument_group("run time and cost (memfit's step-time model)")
    g.add_argument("--tokens", type=positive_int, default=None,
                   help="real tokens the whole run trains on (all epochs); --lengths DATA --epochs E counts them "
                        "instead")
    g.add_argument("--price-per-gpu-hour", type=_price, default=None, metavar="PRICE",
                   help="what one GPU-hour costs, in any currency: the run's cost beside its wall-clock")


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a price such as 2.5, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive price such as 2.5, got {text!r}")
    return value


def run_tokens(a: argparse.Namespace, s, data=None) -> int | None:
    """Real tokens of the whole run: --tokens, or the data's lengths (cut at --seq) times --epochs. `data`: the
    --lengths data the caller already read (read here otherwise)."""
    if a.tokens and getattr(a, "lengths", None):
        raise MemfitError("--tokens and --lengths both say how much the run trains on; give one")
    if a.tokens:
        return a.tokens
    if getattr(a, "lengths", None):
        from memfit.facts.methods import method_facts

        if data is None:
            from memfit.interfaces.lengths.read import read_lengths

            data = read_lengths(a.lengths, s.model)
        # a pair is two rows where the method trains both (DPO), one row of the longer otherwise (lengths/predict.py)
        rows = method_facts(s.method).get("rows_per_example", 1) if data.pairs else 1
        return sum(min(n, s.seq_len) for n in data.tokens) * rows * (a.epochs or 1)
    if a.price_per_gpu_hour is not None:
        raise MemfitError("--price-per-gpu-hour prices the whole run: say its size with --tokens N or --lengths DATA")
    return None


def speed_section(a: argparse.Namespace, s, data=None) -> dict:
    """The estimate's "speed" JSON section for this run (`data`: the --lengths data, when the caller has read it)."""
    from memfit.planner.throughput import run_cost, speed_json

    tokens = run_tokens(a, s, data)
    return speed_json(s, run_cost(s, tokens, a.price_per_gpu_hour) if tokens else None)
