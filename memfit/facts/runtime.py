"""The runtime constants of a machine: memory outside the model's tensors (CUDA context, NCCL buffers,
allocator slack, the host baseline of a process). Defaults come from data/runtime.toml; a machine profile written
by `memfit calibrate` replaces them with what the user's own runs showed, and says so in `source`."""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.data_table import data_table

@dataclass(frozen=True)
class Runtime:
    cuda_context: int
    nccl_one_node: int
    nccl_multi_node: int
    fragmentation_of_churn: float
    process_host_baseline: int
    source: str = "defaults (data/runtime.toml)"

    def with_values(self, values: dict, source: str) -> "Runtime":
        """These constants with `values` replaced (each checked: bytes are whole and >= 0, the slack a share)."""
        names = [f.name for f in fields(self) if f.name != "source"]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise MemfitError(f"{source}: unknown runtime constant {unknown[0]!r}; known: {', '.join(names)}")
        for name, value in values.items():
            share = name == "fragmentation_of_churn"
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            if not ok or (share and value > 1) or (not share and value != int(value)):
                raise MemfitError(f"{source}: {name} must be {'a share from 0 to 1' if share else 'whole bytes >= 0'}"
                                  f", got {value!r}")
        typed = {k: (float(v) if k == "fragmentation_of_churn" else int(v)) for k, v in values.items()}
        return Runtime(**{**{n: getattr(self, n) for n in names}, **typed, "source": source})


@cache
def default_runtime() -> Runtime:
    return Runtime(**data_table("runtime.toml"))
