"""The named sizes of one adapted Linear that data/peft.toml's terms are products of, chosen the way PEFT 0.21.2
chooses them for a Linear of the given widths.

Every method sees T (tokens), I (in_features), O (out_features) and R (rank). LoKr factors both widths into
Kronecker factors, I = I1*I2 and O = O1*O2; OFT splits the input into K blocks of B, with P = B(B-1)/2
trainable entries per block; BOFT splits it into K blocks of B = 4, each a full B x B matrix, and keeps an
I x I permutation buffer. tests/trace/test_peft_shapes.py checks these rules against the shapes of the
layers PEFT builds.
"""
from __future__ import annotations

from math import isqrt

from memfit.errors import MemfitError

# peft/tuners/oft/config.py OFTConfig: oft_block_size = 32, r = 0 (the block count follows from the width)
OFT_BLOCK_SIZE = 32
# peft/tuners/boft/config.py BOFTConfig: boft_block_size = 4, boft_block_num = 0, boft_n_butterfly_factor = 1
BOFT_BLOCK_SIZE = 4


def kron_factors(dimension: int) -> tuple[int, int]:
    """(small, large), small * large = dimension, small the largest divisor not above the square root: what
    peft/tuners/lokr/layer.py `factorization(dimension, -1)` returns (LoKrConfig decompose_factor = -1)."""
    small = next(d for d in range(isqrt(dimension), 0, -1) if dimension % d == 0)
    return small, dimension // small


def lokr_low_rank(sizes: dict[str, int]) -> bool:
    """PEFT's second Kronecker factor is a rank-R product w2_a @ w2_b when R < max(O2, I2) / 2, else one full
    O2 x I2 matrix (peft/tuners/lokr/layer.py LoKrLayer.update_layer, `use_w2`, Linear branch)."""
    return sizes["R"] < max(sizes["O2"], sizes["I2"]) / 2


def oft_block(in_features: int, wanted: int = OFT_BLOCK_SIZE) -> int:
    """The block size OFT uses: `wanted` when it divides in_features, else the nearest divisor (the lower one
    on a tie), the whole width when wanted is not below it (peft/tuners/oft/layer.py adjust_oft_parameters)."""
    if wanted >= in_features:
        return in_features
    if in_features % wanted == 0:
        return wanted
    higher = next((d for d in range(wanted, in_features + 1) if in_features % d == 0), in_features)
    lower = next(d for d in range(wanted, 0, -1) if in_features % d == 0)
    return lower if wanted - lower <= higher - wanted else higher


def layer_sizes(method: str, in_features: int, out_features: int, rank: int) -> dict[str, int]:
    """The named sizes of one Linear under `method` (T is left to the caller)."""
    sizes = {"I": in_features, "O": out_features, "R": rank}
    if method == "lokr":
        (i1, i2), (o1, o2) = kron_factors(in_features), kron_factors(out_features)
        sizes |= {"I1": i1, "I2": i2, "O1": o1, "O2": o2}
    elif method == "oft":
        b = oft_block(in_features)
        sizes |= {"B": b, "K": in_features // b, "P": b * (b - 1) // 2}
    elif method == "boft":
        sizes |= {"B": BOFT_BLOCK_SIZE, "K": boft_blocks(in_features)}
    return sizes


def boft_blocks(in_features: int) -> int:
    """BOFT does not adjust its block size as OFT does: a width it does not divide is refused
    (peft/tuners/boft/layer.py BOFTLayer.update_layer raises ValueError)."""
    if in_features % BOFT_BLOCK_SIZE:
        raise MemfitError(f"boft: a Linear {in_features} wide is not a whole number of PEFT's blocks of "
                          f"{BOFT_BLOCK_SIZE}; PEFT refuses it (choose other --lora-targets)")
    return in_features // BOFT_BLOCK_SIZE


def fact_key(method: str, sizes: dict[str, int]) -> str:
    """The entry of data/peft.toml that holds this Linear's facts: LoKr has one per branch of its w2."""
    if method == "lokr" and not lokr_low_rank(sizes):
        return "lokr_full"
    return method
