"""The GPU catalog (data/gpus.toml), loaded strictly, and GPU names resolved: a catalog id, name or alias, or a card
known only by its memory (--gpu-mem)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.names import norm, suggest, unknown_key

HERE = Path(__file__).parent / "data"


@dataclass(frozen=True)
class GpuSpec:
    id: str
    name: str
    memory_bytes: int
    bf16_tflops: float = 0.0
    memory_bandwidth_gbps: float = 0.0
    interconnect: str = "pcie"
    interconnect_gbps: float = 32.0
    compute_capability: float = 8.0
    aliases: tuple[str, ...] = ()
    source: str = ""
    vendor: str = "nvidia"  # "amd": compute_capability is torch's (major, minor) of the gfx arch, not an SM version
    # which report the row's memory came from; an nvidia-smi figure is turned into torch's at load (gpus.toml
    # [memory_basis]): memory_bytes is always what torch can allocate, listed_memory_bytes what the row says
    memory_basis: str = "torch"
    listed_memory_bytes: int = 0
    speed_of: str = ""  # a card known by its memory (--gpu-mem): the catalog GPU whose speed facts it borrows

    @property
    def speed_id(self) -> str:
        """The id the speed table (speed.toml [mfu], host links) knows this GPU by."""
        return self.speed_of or self.id


_GPU_FIELDS = {f.name for f in fields(GpuSpec)}
_GPU_CHOICES = {"interconnect": ("nvlink", "pcie", "infinity-fabric"), "memory_basis": ("torch", "nvidia-smi"),
                "vendor": ("nvidia", "amd")}


@cache
def gpus() -> tuple[GpuSpec, ...]:
    with open(HERE / "gpus.toml", "rb") as f:
        data = tomllib.load(f)
    hidden = {basis: int(row["hidden_mib"]) * 2**20 for basis, row in data.get("memory_basis", {}).items()}
    return tuple(_gpu_row(g, f"gpus.toml:{g.get('id')}", hidden) for g in data.get("gpu", []))


def _gpu_row(g: dict, where: str, hidden: dict[str, int]) -> GpuSpec:
    """One [[gpu]] row, strictly: every key known, every choice valid, memory turned into torch's figure."""
    listed = set(_GPU_FIELDS) - {"listed_memory_bytes", "speed_of"}
    for key, value in g.items():
        if key not in listed:
            raise unknown_key(where, key, listed)
        if key in _GPU_CHOICES and value not in _GPU_CHOICES[key]:
            raise MemfitError(f"{where}: {key} = {value!r}; choose one of: {', '.join(_GPU_CHOICES[key])}")
    casts = {"aliases": tuple, "compute_capability": float, "memory_bytes": int}
    row = {k: casts.get(k, lambda x: x)(v) for k, v in g.items()}
    basis = row.get("memory_basis", "torch")
    row["listed_memory_bytes"] = row["memory_bytes"]
    row["memory_bytes"] -= hidden.get(basis, 0)  # what the driver keeps beyond torch's total_memory
    try:
        return GpuSpec(**row)
    except TypeError as e:
        raise MemfitError(f"{where}: incomplete GPU facts ({e})") from None


@cache
def _gpu_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for g in gpus():
        for key in (g.id, g.name, *g.aliases):
            index.setdefault(norm(key), g)
    return index


def find_gpu(name: str) -> GpuSpec:
    index = _gpu_index()
    key = norm(name)
    for candidate in (key, key.removeprefix("nvidia-"), key.removeprefix("geforce-")):
        if candidate in index:
            return index[candidate]
    variants = _variants(key)
    if len(variants) > 1:  # `a100`: the 40 GB or the 80 GB card; memfit does not pick one silently
        raise MemfitError(f"GPU {name!r} names {len(variants)} cards: {', '.join(variants[:-1])} or {variants[-1]}; "
                          f"say which (see `memfit gpus`)")
    raise MemfitError(f"unknown GPU {name!r}{suggest(name, index)} (see `memfit gpus`, or give --gpu-mem 24GiB)")


def _variants(key: str) -> list[str]:
    """The catalog GPUs whose id is the name plus a qualifier (`a100` -> a100-40gb, a100-80gb, a100-80gb-pcie)."""
    key = key.removeprefix("nvidia-").removeprefix("geforce-").removeprefix("tesla-")
    return [g.id for g in gpus() if g.id.startswith(key + "-")] if key else []


def custom_gpu(memory_bytes: int, like: GpuSpec | None = None) -> GpuSpec:
    """A GPU known only by its memory; speed facts borrowed from `like` (or an A100-class default)."""
    if memory_bytes <= 0:
        raise MemfitError(f"--gpu-mem must be positive, got {memory_bytes} bytes")
    base = like or GpuSpec(id="custom", name="custom", memory_bytes=memory_bytes, bf16_tflops=312.0,
                           memory_bandwidth_gbps=2000.0, compute_capability=8.0)
    return GpuSpec(**{**base.__dict__, "id": f"custom-{memory_bytes}", "name": f"{base.name} ({memory_bytes / 2**30:.1f} GiB)",
                      "memory_bytes": memory_bytes, "speed_of": like.speed_id if like else ""})
