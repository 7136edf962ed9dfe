"""LLaMA-Factory's own argument parser in one long-lived process of its venv, for every check of a run.

Each check used to start a fresh torchrun of the venv's python (about 12 s: it imports transformers, peft and
trl), so a test module that checks six files spent a minute importing. This process imports once and then answers
one JSON request per line on stdin: `{"doc": <dict or flag list>, "cwd": <folder>}` -> `get_train_args(doc)` run
from that folder (so a relative `deepspeed:` path resolves as it does for the user), one `MEMFIT-RESULT` line back
with the parsed view or the error. The environment is what torchrun gives one local rank (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR / MASTER_PORT), which is all LLaMA-Factory's checks read. A process that dies is started
again on the next request, and its own last error line is the message.
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import tempfile
from pathlib import Path

from memfit.interfaces.formats.framework_tables import ValidationFailed

LOOP = r"""
import json, os, sys
from llamafactory.hparams import get_train_args
PARSED = __PARSED__
for line in sys.stdin:
    req = json.loads(line)
    os.chdir(req["cwd"])
    try:
        args = dict(zip(("model", "data", "training", "finetuning", "generating"), get_train_args(req["doc"])))
        out = {"parsed": {key: (lambda v: str(getattr(v, "value", v)) if key in ("flash_attn", "optim") else v)(
            getattr(args[part], key)) for key, part in PARSED.items()}}
    except BaseException as e:  # argparse's own refusal is a SystemExit
        out = {"error": f"{type(e).__name__}: {e}"}
    print("MEMFIT-RESULT " + json.dumps(out), flush=True)
"""


class ParserProcess:
    """One venv python running LOOP; `parse(doc, cwd)` sends a request and reads its answer."""

    def __init__(self, python: Path, parsed: dict[str, str]):
        self.python, self.parsed = python, parsed
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile(mode="w+")

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, DISABLE_VERSION_CHECK="1", CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false",
                   HF_HUB_OFFLINE="1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
        code = LOOP.replace("__PARSED__", repr(self.parsed))
        self.log.seek(0), self.log.truncate()
        proc = subprocess.Popen([str(self.python), "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self.log, text=True, env=env, cwd=tempfile.gettempdir())
        atexit.register(proc.kill)
        return proc

    def parse(self, doc, cwd: Path | None) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None:  # _start opens both as pipes
            raise ValidationFailed("LLaMA-Factory: its parser process has no stdin / stdout pipe")
        stdin.write(json.dumps({"doc": doc, "cwd": str(cwd or tempfile.gettempdir())}) + "\n")
        stdin.flush()
        for line in stdout:
            if line.startswith("MEMFIT-RESULT "):
                out = json.loads(line[len("MEMFIT-RESULT "):])
                if "error" in out:
                    raise ValidationFailed(f"LLaMA-Factory: {out['error']}")
                return out["parsed"]
        self.log.seek(0)
        tail = [x for x in self.log.read().splitlines() if "Error" in x] or ["its process exited"]
        self.proc = None
        raise ValidationFailed(f"LLaMA-Factory: {tail[-1].strip()}")
