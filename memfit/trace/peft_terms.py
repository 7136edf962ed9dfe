"""Reading the tensors a PEFT layer holds as products of named sizes, shared by memfit/trace/peft_facts.py (adapted
Linears) and memfit/trace/token_facts.py (trainable tokens on the embedding)."""
from __future__ import annotations

import torch

# (name, autocast, frozen dtype, adapter dtype): the precision setups memfit tells apart (Scenario.runs_autocast,
# compute_bytes, adapter_bytes)
SETUPS = (("autocast", True, torch.bfloat16, torch.float32),
          ("autocast_16bit_adapters", True, torch.bfloat16, torch.bfloat16),
          ("16bit_fp32_adapters", False, torch.bfloat16, torch.float32),
          ("16bit", False, torch.bfloat16, torch.bfloat16),
          ("fp32", False, torch.float32, torch.float32))


def saving_into(saved: list[torch.Tensor]) -> torch.autograd.graph.saved_tensors_hooks:
    """Hooks that append every tensor autograd saves to `saved`, and hand it back unchanged."""
    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def monomial(count: int, sizes: dict) -> str:
    """`count` as a product of the named sizes, e.g. 29 * 11 -> "T*I"; a leftover factor is kept as a number.
    Named sizes may be products of others (I = I1*I2): the reading with the smallest leftover, then the fewest
    factors, wins ("T*I", not "T*I1*I2")."""
    symbols = list(sizes)
    readings = []

    def search(i: int, rest: int, powers: tuple) -> None:  # only the products that divide `count`
        if i == len(symbols):
            if not any(rest % sizes[s] == 0 for s in symbols):
                readings.append(((rest, sum(powers)), powers))
            return
        for p in range(4):
            if rest % sizes[symbols[i]] ** p:
                break
            search(i + 1, rest // sizes[symbols[i]] ** p, powers + (p,))

    search(0, count, ())
    if not readings:
        raise ValueError(f"{count} is not a product of {sizes}")
    (rest, _), powers = min(readings)
    names = [s for s, p in zip(symbols, powers) for _ in range(p)]
    return "*".join(([str(rest)] if rest != 1 else []) + names) or "1"


def tensor_terms(tensors, sizes: dict) -> list[tuple[str, int]]:
    """(monomial, bytes per element) of each distinct storage."""
    seen, out = set(), []
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or t.dtype == torch.bool and t.numel() == 1:
            continue
        seen.add(storage.data_ptr())
        out.append((monomial(storage.nbytes() // t.element_size(), sizes), t.element_size()))
    return out


def agreed(method: str, setup: str, readings: list):
    """The one reading of both size sets, or a loud failure: some term is not a product of named sizes."""
    if any(r != readings[0] for r in readings):
        raise ValueError(f"{method}.{setup}: the two size sets read differently ({readings}); a tensor is not a "
                         "product of named sizes - name the size it depends on in METHOD_SIZES")
    return readings[0]
