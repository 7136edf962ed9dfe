"""The files `memfit fit` rewrites: one framework file (with the DeepSpeed JSON it names), or every file of a
launch (formats/launch_write.py). Either way the same four things: what they can say, the new texts for a set of
knobs, the run they read back as, and where each new text goes."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from memfit.errors import MemfitError


@dataclass
class FitFiles:
    said: frozenset  # the knobs the files can say
    write: Callable  # knobs -> [WrittenFile] (raises MemfitError for what they cannot say)
    reread: Callable  # [WrittenFile] -> ImportedConfig of the run as written
    target: Callable  # ([WrittenFile], path) -> where that file is written
    launch: bool = False
    read: Callable = lambda: set()  # every file on disk the run reads (a launch's, so --out can hold all of them)


def fit_files(imported, paths: list, gpus: int, out: Path | None) -> FitFiles:
    """`out`: the --out folder (None: --in-place)."""
    from memfit.interfaces.formats import reread, sayable, write_config_files

    if imported.format == "launch":
        return _launch_files(paths, gpus, out)
    return FitFiles(sayable(imported), lambda knobs: write_config_files(imported, knobs, out),
                    lambda files: reread(imported, files),
                    lambda files, path: _target(out, path, new=any(f.path == path and f.old_text is None for f in files)))


def _launch_files(paths: list, gpus: int, out: Path | None) -> FitFiles:
    from memfit.interfaces.formats import launch_write
    from memfit.interfaces.formats.launch_sources import read_launch

    launch = read_launch(paths, gpus)
    return FitFiles(launch_write.sayable(launch), lambda knobs: launch_write.write(launch, knobs),
                    lambda files: launch_write.reread(launch, files, gpus),
                    lambda files, path: launch_write.target(launch, files, path, out), launch=True,
                    read=launch.files)


def _target(out: Path | None, path: Path, new: bool = False) -> Path:
    """Where a rewritten file goes; --out must not name the file itself (that is --in-place, with its backup). A new
    file (a DeepSpeed JSON the plan needs) is already named in --out: an earlier fit there may have written it."""
    if out is None or new:
        return Path(path)
    target = Path(out) / Path(path).name
    if target.exists() and Path(path).exists() and os.path.samefile(target, path):
        raise MemfitError(f"--out {out} would overwrite {path} itself; use --in-place (keeps a backup) "
                          "or another --out folder")
    return target
