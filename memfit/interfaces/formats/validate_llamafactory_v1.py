"""LLaMA-Factory's v1 config (`USE_V1=1 llamafactory-cli sft|dpo|rm config.yaml`, src/llamafactory/v1/config) checked
with its own code in the LLaMA-Factory virtual environment (tests/formats/README.md): the key table
(tables/llamafactory_v1.json) is its four argument dataclasses, and a file is valid when v1's own
`get_args(dict)` (an HfArgumentParser that refuses unknown keys) parses it."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from memfit.interfaces.formats.framework_tables import ValidationFailed
from memfit.interfaces.formats.validate import _lf_python

_SCRIPT = r"""
import importlib.util, json, sys
doc = json.load(open(sys.argv[1]))
if sys.argv[2] == "table":
    spec = importlib.util.spec_from_file_location("framework_tables", sys.argv[3])
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    import llamafactory
    from llamafactory.v1.config.data_args import DataArguments
    from llamafactory.v1.config.model_args import ModelArguments
    from llamafactory.v1.config.sample_args import SampleArguments
    from llamafactory.v1.config.training_args import TrainingArguments
    classes = (ModelArguments, DataArguments, TrainingArguments, SampleArguments)
    print("MEMFIT-RESULT " + json.dumps({"version": llamafactory.__version__,
                                         "fields": {c.__name__: tables.dataclass_table(c) for c in classes}}))
    sys.exit(0)
from llamafactory.v1.config.arg_parser import get_args
plain = lambda v: v if v is None or isinstance(v, (bool, int, float, str, list, dict)) else str(v)
def parse(one):
    model_args, data_args, training_args, sample_args = get_args(one)
    return {name: {k: plain(v) for k, v in vars(args).items()} for name, args in
            (("model", model_args), ("training", training_args))}
if sys.argv[2] == "parse":
    print("MEMFIT-RESULT " + json.dumps(parse(doc)))
    sys.exit(0)
out = []  # "many": one process for several files (importing LLaMA-Factory takes ~10 s)
for one in doc:
    try:
        out.append({"parsed": parse(one)})
    except BaseException as e:  # HfArgumentParser exits on an unknown key
        out.append({"error": f"{type(e).__name__}: {e}"})
print("MEMFIT-RESULT " + json.dumps(out))
"""


def _run(doc, mode: str):
    python = _lf_python()
    here = Path(__file__).resolve().parent / "framework_tables.py"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "args.json").write_text(json.dumps(doc))
        (Path(tmp) / "run.py").write_text(_SCRIPT)
        env = dict(os.environ, DISABLE_VERSION_CHECK="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
        done = subprocess.run([str(python), str(Path(tmp) / "run.py"), str(Path(tmp) / "args.json"), mode, str(here)],
                              capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    if done.returncode != 0:
        lines = [x for x in (done.stderr + done.stdout).splitlines() if "Error" in x]
        raise ValidationFailed(f"LLaMA-Factory v1: {(lines or ['exit ' + str(done.returncode)])[-1].strip()}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("MEMFIT-RESULT "))
    return json.loads(line[len("MEMFIT-RESULT "):])


def llamafactory_v1_table() -> dict:
    out = _run({}, "table")
    # output_dir's default is a fresh uuid per run: not a fact about the release
    out["fields"]["TrainingArguments"]["output_dir"]["default"] = None
    return {"source": f"llamafactory {out['version']} llamafactory.v1.config (ModelArguments, DataArguments, "
                      "TrainingArguments, SampleArguments)", **out["fields"]}


def validate_llamafactory_v1(doc: dict) -> dict:
    """The file's arguments as v1's own parser reads them ({"model": ..., "training": ...}); ValidationFailed if
    it refuses them."""
    return _run(doc, "parse")


def validate_many(docs: list[dict]) -> list[dict | ValidationFailed]:
    """validate_llamafactory_v1 of each doc, in one process: the parsed arguments, or the ValidationFailed."""
    return [ValidationFailed(f"LLaMA-Factory v1: {r['error']}") if "error" in r else r["parsed"]
            for r in _run(docs, "many")]


if __name__ == "__main__":  # a maintainer's step after upgrading LLaMA-Factory in its venv
    out = Path(__file__).parent / "tables" / "llamafactory_v1.json"
    out.write_text(json.dumps(llamafactory_v1_table(), indent=1) + "\n")
