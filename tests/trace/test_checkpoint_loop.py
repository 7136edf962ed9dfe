"""data/releases.toml `checkpoint_from_loop` against transformers' own modeling files: the families whose model forward
checkpoints each decoder layer from its loop (`self._gradient_checkpointing_func(layer.__call__, ...)`, which FSDP1
enters again inside a reentrant recompute: memory/states/accelerate_fsdp.py), read in the installed release (memfit's
pin) and in transformers 4.48.1 (the venv of tests/trace/setup_fms_venv.sh)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from memfit.facts.catalog import architectures
from memfit.facts.releases import packages, release_range
from memfit.facts.versions import pinned

ROOT = Path(__file__).resolve().parents[2]
FMS_VENV = Path(os.environ.get("MEMFIT_FMS_VENV", ROOT / ".venvs" / "fms"))
# the loop hands the layer's bound __call__ (4.50 / 4.51 through functools.partial) to the checkpoint function
LOOP_CALL = re.compile(r"_gradient_checkpointing_func\(\s*(?:partial\(\s*)?\w+\.__call__")


def _families_checkpointed_from_loop(transformers_dir: Path) -> tuple[set[str], set[str]]:
    """(families whose every modeling file there calls it from the loop, families with a modeling file there)."""
    looped, present = set(), set()
    for family, facts in architectures().items():
        files = [transformers_dir / "models" / t / f"modeling_{t}.py" for t in facts.get("hf_model_types", ())]
        texts = [f.read_text() for f in files if f.exists()]
        if texts:
            present.add(family)
            if all(LOOP_CALL.search(text) for text in texts):
                looped.add(family)
    return looped, present


def _listed(version: str) -> set[str]:
    return set(release_range("transformers", version).get("checkpoint_from_loop", ()))


def test_every_family_named_is_one_memfit_knows():
    known = set(architectures())
    for r in packages()["transformers"]["range"]:
        assert set(r.get("checkpoint_from_loop", ())) <= known, r["from"]


def test_the_pinned_release_checkpoints_every_family_inside_its_layer():
    import transformers

    looped, present = _families_checkpointed_from_loop(Path(transformers.__file__).parent)
    assert transformers.__version__ == pinned()["transformers"]
    assert len(present) > 20 and looped == set() == _listed(transformers.__version__)


def test_transformers_4_48_checkpoints_the_families_listed_from_their_loop():
    site = next(iter(sorted(FMS_VENV.glob("lib/python*/site-packages/transformers"))), None)
    if site is None:
        pytest.skip(f"no fms-acceleration venv at {FMS_VENV}: bash tests/trace/setup_fms_venv.sh")
    looped, present = _families_checkpointed_from_loop(site)
    assert "llama" in looped and "gpt_bigcode" in looped
    # starcoder2's loop calls no checkpoint function there: neither listed nor looped
    assert looped == _listed("4.48.1") & present
