"""Unsloth's fused linear cross entropy (`--loss unsloth_ce`), modelled from unsloth_zoo 2026.10.9's source
(fused_losses/fused_linear.py): unsloth imports only on a GPU, so memfit cannot trace it (frameworks/unsloth.toml).

The loss never holds [tokens, vocab] logits. `_ce_impl` writes the hidden states' gradient [tokens, hidden] (and a
trained head's [vocab, hidden]) during the forward, and `_ce_setup` keeps them for backward, whose `_ce_backward`
scales each into a new tensor beside the kept one. In the forward one buffer holds the logits of a chunk of rows:
- the chunked path (`_Buffers`): [R, vocab rounded up to 8] in fp32 (the projection writes fp32 through
  `mm(out_dtype=float32)`; an fp32 run is fp32 anyway), the logits' half-precision gradient written into the same
  bytes, and each chunk's fp32 [R, hidden] input gradient beside it. R (`fused_linear_rows`) is Liger's rule, the
  power of two at or below tokens * hidden / vocab, raised to the power of two at or below 512 * 151936 / vocab
  clamped to [512, 4096], at most 4096, and at most the budget (`_budget_bytes`: min(2 GiB, half the free memory);
  memfit takes 2 GiB) over vocab * 4 bytes.
- the tiled path (`_tiled_forward`), taken with a frozen head under 16-bit compute on a CUDA card of compute
  capability >= 8 whose vocabulary spans more than two 16384-column splits, when the card has at most 24.5 GiB or
  the batch at least 4096 rows: [R, tile] fp32 with R = min(4096, rows) and R * tile * 4 within 256 MiB
  (`_BWD_TILE_BYTES`), tile a multiple of 16384 columns (16384 on the small cards), plus an fp32 [R, hidden]
  accumulator.
"""
from __future__ import annotations
from memfit.facts.scenario import Scenario

MIB, GIB = 1024 ** 2, 1024 ** 3
BUDGET = 2 * GIB  # _CHUNK_GB = 2.0 (UNSLOTH_LOGPROB_CHUNK_GB); half the free memory is rarely less
MIN_LOGITS = 512 * 151936  # _MIN_LOGITS: fewer rows starve the K = vocab GEMM
MAX_ROWS = 4096  # _MAX_ROWS (UNSLOTH_FUSED_LINEAR_MAX_ROWS), also _BWD_ROWS
SPLIT_COLS = 16384  # _SPLIT_COLS: vocabulary splits of the tiled path
TILE_BYTES = 256 * MIB  # _BWD_TILE_BYTES
SMALL_CARD = 24.5 * GIB  # _SMALL_CARD_BYTES: at most this, the tiled path takes any batch (_flash_min_rows_auto)
LOGIT_BYTES = 4  # fp32 logits (_logits_mode on CUDA; fp32 compute has no half logits either)


def _pow2_at_most(x: float) -> int:
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def chunk_rows(n: int, h: int, v: int) -> int:
    """fused_linear_rows(n, h, v, 4): rows per chunk of the chunked path."""
    rows = _pow2_at_most(n * h / max(v, 1))
    floor = min(max(_pow2_at_most(MIN_LOGITS / max(v, 1)), 512), MAX_ROWS)
    rows = min(max(rows, floor), MAX_ROWS, max(BUDGET // (v * LOGIT_BYTES), 2))
    return max(min(rows, max(n, 1)), 1)


def _tiled(s: Scenario, n: int, v: int, head_trains: bool) -> bool:
    gpu = s.hardware.gpu
    return (s.compute_bytes == 2 and not head_trains and gpu.compute_capability >= 8.0
            and -(-v // SPLIT_COLS) > 2 and (gpu.memory_bytes <= SMALL_CARD or n >= MAX_ROWS))


def loss_terms(s: Scenario, n: int, v: int, b: int, head_bytes: int) -> tuple[int, int, int]:
    """(forward peak, saved after forward, backward peak) of the loss over `n` rows, like memory/activations.py's
    other losses; `b` the hidden states' bytes, `head_bytes` a trained head's (0: frozen)."""
    h = s.model.hidden_size
    head_trains = head_bytes > 0
    grads = n * h * b + v * h * head_bytes  # the gradients the forward writes (in the tensors' dtypes) and keeps
    if _tiled(s, n, v, head_trains):
        rows = min(MAX_ROWS, n)
        tile = max(TILE_BYTES // (rows * LOGIT_BYTES), SPLIT_COLS)
        if s.hardware.gpu.memory_bytes <= SMALL_CARD:
            tile = min(tile, SPLIT_COLS)
        tile = min(tile - tile % SPLIT_COLS, -(-v // SPLIT_COLS) * SPLIT_COLS)
        chunk = rows * tile * LOGIT_BYTES + rows * h * 4
    else:
        rows = chunk_rows(n, h, v)
        chunk = rows * (-(-v // 8) * 8) * LOGIT_BYTES + rows * h * 4  # the chunk's fp32 input gradient (_dz_w)
    return chunk + grads, grads, 2 * grads
