"""verl's own composition of a launch, from memfit's side: runs verl_compose.py in verl's virtual environment
(`.venvs/verl`, or $MEMFIT_VERL_VENV; tests/trace/setup_verl_venv.sh builds it) and returns what Hydra and
verl's config dataclasses made of it. Used by the tests (tests/formats/test_verl_venv.py) and by a maintainer
regenerating tables/verl.json after a verl upgrade (`write_table`)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from memfit.interfaces.formats.framework_tables import ValidationFailed

ROOT = Path(__file__).resolve().parents[3]
VERL_VENV = Path(os.environ.get("MEMFIT_VERL_VENV", ROOT / ".venvs" / "verl"))
TABLE = Path(__file__).parent / "tables" / "verl.json"


def python() -> Path:
    exe = VERL_VENV / "bin" / "python"
    if not exe.exists():
        raise FileNotFoundError(f"no verl virtual environment at {VERL_VENV} (bash tests/trace/setup_verl_venv.sh)")
    return exe


def _run(args: list[str], stdin: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(python()), "-m", "memfit.interfaces.formats.verl_compose", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        raise ValidationFailed(f"verl_compose {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def derived_table() -> dict:
    """The table as the installed verl composes it."""
    return json.loads(_run(["table"]))


def write_table() -> None:
    TABLE.write_text(json.dumps(derived_table(), indent=1) + "\n")


def compose_launches(launches) -> list[dict]:
    """Hydra's composition of each launch (verl_command.Launch: its overrides and --config-path / --config-name):
    {"config": flat resolved keys, "dataclasses": {section: "ok" | error}} or {"error": Hydra's refusal}."""
    runs = [{"words": list(launch.words), "options": _options(launch)} for launch in launches]
    out = _run(["batch"], json.dumps(runs))
    line = next(x for x in out.splitlines() if x.startswith("MEMFIT-RESULT "))
    return json.loads(line[len("MEMFIT-RESULT "):])


def _options(launch) -> dict:
    """--config-dir (from where the launch runs) or an absolute --config-path: the folder Hydra composes from."""
    options = dict(launch.options)
    folder = options.pop("config_dir", None)
    if folder:
        options["config_path"] = str((launch.cwd / folder).resolve())
    return options
