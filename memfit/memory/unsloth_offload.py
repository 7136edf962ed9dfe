"""Unsloth's own offloaded checkpointing (use_gradient_checkpointing="unsloth"), modelled from unsloth_zoo
2026.10.9's source (gradient_checkpointing.py UnslothCheckpointFunction, initialize_unsloth_gradient_checkpointing;
unsloth/models/_utils.py apply_unsloth_gradient_checkpointing): unsloth imports only on a GPU, so memfit cannot
trace it. Only the unsloth profile runs this code (its [model_code] offload table); `--ckpt unsloth` under another
profile is LLaMA-Factory's use_unsloth_gc, which sends every layer input to the host.

- a max_seq_length below 512: unsloth unpatches its checkpointing and runs torch's reentrant one (nothing offloaded);
- a layer input whose stored bytes are at most 2 MiB (MINIMUM_SIZE) stays on the GPU; so does the last checkpointed
  layer's, from the second step on (LAST_GC_INDEX);
- an fp32 input is stored as bf16 (UNSLOTH_OFFLOAD_FP32 unset), a 16-bit one as it is;
- backward brings an input back into a GPU staging buffer as large as one stored input, and a second one (double
  buffering) once more than 512 MiB is free after the first step; both live from then on.
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.facts.frameworks import model_code
from memfit.facts.scenario import Scenario


@dataclass(frozen=True)
class Offload:
    host: int  # bytes kept in host RAM
    device: int  # bytes on the GPU beside the saved activations: the last layer's input, the staging buffers


def unsloth_offload(s: Scenario, checkpoint: int, layers: int) -> Offload | None:
    """Where unsloth keeps `layers` checkpointed layer inputs of `checkpoint` bytes each; None when the run is not
    unsloth's own offloading, an Offload with no host bytes when it offloads nothing (the inputs stay saved)."""
    code = model_code(s.profile).get("offload")
    if not code or s.checkpointing != "unsloth" or not layers:
        return None
    stored = s.tokens_per_micro_batch * s.model.hidden_size * code["stored_bytes"]
    if s.seq_len < code["min_seq"] or stored <= code["min_bytes"]:
        return Offload(0, 0)
    kept = code["keeps_last"]
    return Offload(host=(layers - kept) * stored, device=kept * checkpoint + code["staging_buffers"] * stored)
