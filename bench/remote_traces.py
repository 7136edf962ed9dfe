"""What bench/qwen1.py and bench/glm4.py share: re-tracing a hub remote-code family's rows on its own modeling file
(memfit/trace/<module>.py) into the bench's JSON, stamped with the file's sha256 and the libraries it ran on."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def traced(model: str, family: str, module: str, sha_key: str, rows: list[dict], trace_row,
           keep: list | None = None) -> dict:
    """`trace_row(knobs)` -> the saved row, for every row but those in `keep` (traced before, of the same file)."""
    import torch
    import transformers

    from memfit.facts.remote_code import remote_code

    out = {"model": model, "source": remote_code(family)["source"], sha_key: _file_sha256(module),
           "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0], "rows": []}
    done = {json.dumps(r["knobs"], sort_keys=True): r for r in keep or []}
    for knobs in rows:
        key = json.dumps(knobs, sort_keys=True)
        if key not in done:
            done[key] = trace_row(knobs)
            print(knobs, file=sys.stderr, flush=True)
        out["rows"].append(done[key])
    return out


def saved(out: Path, module: str, sha_key: str, traced_rows, argv: list[str]) -> dict:
    """The bench's saved traces, re-traced first if `argv` asks: --trace rewrites `out` from `traced_rows(None)`,
    --trace-missing keeps the rows traced on this same file (`traced_rows(kept rows)`)."""
    if "--trace" in argv or "--trace-missing" in argv:
        old = json.loads(out.read_text()) if out.exists() else {}
        keep = old["rows"] if "--trace-missing" in argv and old.get(sha_key) == _file_sha256(module) else None
        out.write_text(json.dumps(traced_rows(keep), indent=1) + "\n")
    return json.loads(out.read_text())


def _file_sha256(module: str) -> str:
    # imported only to trace: the trace modules need torch, the benches' tables do not
    return importlib.import_module(f"memfit.trace.{module}").file_sha256()
