"""Tokens in a batch, for the callbacks that see batches: memfit watch compares ranks' peaks with them."""
from __future__ import annotations


def batch_tokens(batch) -> int | None:
    """input_ids' element count (padding included: padded tokens take activation memory too), or the first
    two dimensions of the first tensor of a tuple/list batch; None when the batch says nothing."""
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        return _numel(ids)
    if isinstance(batch, (tuple, list)) and batch:
        return batch_tokens(batch[0])
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) >= 2:
        return int(shape[0]) * int(shape[1])
    return None


def _numel(x) -> int | None:
    return int(x.numel()) if hasattr(x, "numel") else None
