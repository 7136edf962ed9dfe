"""Ground truth for activations and temporaries: the real transformers/PEFT training step on fake tensors.

Needs the `trace` extra (torch, transformers, peft). Importing this package does not import torch;
the names below load their modules on first use, so `import memfit` stays torch-free.

    from memfit.trace import run_trace, render
    result = run_trace(scenario)            # TraceResult; result.profile is a PhaseProfile
"""
from __future__ import annotations

_EXPORTS = {
    "run_trace": "memfit.trace.run",
    "render": "memfit.trace.output",
    "write_timeline": "memfit.trace.output",
    "layer_profile": "memfit.trace.run",
    "TraceResult": "memfit.trace.run",
    "build_model": "memfit.trace.build",
    "hf_config": "memfit.trace.build",
    "Accountant": "memfit.trace.accountant",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        try:
            module = importlib.import_module(_EXPORTS[name])
        except ImportError as e:
            from memfit.errors import MemfitError

            raise MemfitError(f"memfit trace needs torch, transformers and peft ({e.name} is missing): "
                              f"pip install torch==2.13.0 && pip install 'memfit[trace]'") from None
        return getattr(module, name)
    raise AttributeError(f"module 'memfit.trace' has no attribute {name!r}")
