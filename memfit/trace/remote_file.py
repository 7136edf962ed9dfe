"""A hub remote-code modeling file kept outside the repository (fetched from a public mirror), imported as a
package so its relative imports (its configuration) resolve. Used by the tracers of such families (qwen1.py,
glm4.py); only facts derived from the file are shipped (facts/data/remote_code.toml)."""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RemoteFile:
    env: str  # the variable naming the folder that holds the files
    default: str  # the folder when it is unset
    package: str  # the package name the files are imported under
    files: tuple[str, ...]  # the first is the modeling file

    def source_dir(self) -> Path:
        return Path(os.environ.get(self.env, self.default))

    def available(self) -> bool:
        return all((self.source_dir() / f).is_file() for f in self.files)

    def file_sha256(self, name: str | None = None) -> str:
        return hashlib.sha256((self.source_dir() / (name or self.files[0])).read_bytes()).hexdigest()

    def load(self):
        """The modeling module, imported from source_dir() (once per process)."""
        name = f"{self.package}.{Path(self.files[0]).stem}"
        if name not in sys.modules:
            package = types.ModuleType(self.package)
            package.__path__ = [str(self.source_dir())]
            sys.modules[self.package] = package
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        return sys.modules[name]
