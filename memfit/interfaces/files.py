"""Writing the user's files: the one place memfit changes a file it did not create for itself.

    done = write_files([FileWrite(Path("train.yaml"), new_text, expect=old_text)], backup=True)

Every file of a change set is written to a temporary file in its own folder, fsynced, then renamed over the
target (atomic on POSIX): a reader, a crash or a full disk never leaves half a file. The set is all or
nothing: if any step fails, every file already replaced gets its original bytes and permission bits back
(a file that did not exist is removed, so are the backups and folders made on the way), and the error is one
line. With `backup=True` the original is first copied to `NAME.memfit-bak`; an existing backup is never
overwritten (the next free `NAME.memfit-bak.1`, `.2`, ... is used), so the first backup keeps the file as the
user wrote it. Refused before anything is written: a symlink that leads outside the target's folder, a
folder or a special file (device, pipe, socket) at the target, and a file that changed on disk since memfit
read it. A file that already holds the new bytes is left alone (no write, no backup): a second run that
changes nothing touches nothing.
"""
from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from memfit.errors import MemfitError

BACKUP_SUFFIX = ".memfit-bak"
UNCHECKED = object()  # FileWrite.expect: the target may hold anything (memfit's own output, e.g. under --out)


@dataclass(frozen=True)
class FileWrite:
    """One file to write. `expect`: the text memfit read from it (None: it did not exist), checked again just
    before writing so an edit made meanwhile is never lost; UNCHECKED for files memfit owns."""

    path: Path
    text: str
    expect: object = UNCHECKED


@dataclass(frozen=True)
class Written:
    path: Path  # the file written (a symlink's target when the path is a link inside its folder)
    backup: Path | None  # where the original went (backup=True and the file existed)
    unchanged: bool  # it already held these bytes: nothing was written


@dataclass
class _Target:
    write: FileWrite
    real: Path
    old: bytes | None  # the bytes on disk before (None: no file)
    new: bytes
    mode: int
    temp: Path | None = None
    backup: Path | None = None
    replaced: bool = False


def write_files(writes: list[FileWrite], *, backup: bool = False) -> list[Written]:
    """Write every file or none (see the module docstring); a failure is one MemfitError line."""
    targets = [_target(w) for w in writes]  # every refusal comes before the first byte is written
    _no_two_writes_to_one_file(targets)
    todo = [t for t in targets if t.old != t.new]
    made: list[Path] = []
    step = ""
    try:
        for t in todo:
            step = f"{t.write.path}: cannot write"
            made += _make_folders(t.real.parent)
            t.temp = _stage(t.real, t.new, t.mode)
        for t in todo:
            if backup and t.old is not None:
                step = f"{t.write.path}: cannot save its backup"
                t.backup = _save_backup(t.real, t.old, t.mode)
            step = f"{t.write.path}: cannot replace it"
            assert t.temp is not None, "staged in the loop above"
            os.replace(t.temp, t.real)
            t.replaced = True
        for folder in {t.real.parent for t in todo}:
            _fsync_folder(folder)  # the renames themselves survive a power cut
    except BaseException as e:  # an interrupt too: never leave the set half-written
        failed = _roll_back(todo, made)
        if isinstance(e, OSError):
            raise MemfitError(f"{step} ({e.strerror or e}); {failed or 'no file was changed'}") from None
        if failed and isinstance(e, MemfitError):
            raise MemfitError(f"{e}; {failed}") from None
        raise
    return [Written(t.real, t.backup, t.old == t.new) for t in targets]


# --- before anything is written ---------------------------------------------------------------------------

def _target(w: FileWrite) -> _Target:
    path = Path(w.path)
    real = _real_path(path)
    st = _regular_or_missing(path, real)
    try:
        old = _read(real) if st else None
    except OSError as e:
        raise MemfitError(f"{path}: cannot read it before writing ({e.strerror or e}); no file was changed") from None
    _unchanged_since_read(path, old, w.expect)
    new = _encode(w.text, old)
    mode = stat.S_IMODE(st.st_mode) if st else 0o666 & ~_umask()
    return _Target(w, real, old, new, mode)


def _real_path(path: Path) -> Path:
    """The file a write reaches: a symlink is followed (the link itself stays a link) only when it leads to a
    file in the link's own folder or below; a link elsewhere could make memfit write a file the user never named."""
    if not path.is_symlink():
        return path
    folder = path.absolute().parent.resolve()
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a loop of links
        raise MemfitError(f"{path}: is a symlink that does not resolve; point it at a file, or write with --out") \
            from None
    if not real.is_relative_to(folder):
        raise MemfitError(f"{path}: is a symlink to {real}, outside {folder}; memfit does not write through it "
                          "(use --out, or replace the link with the file)")
    return real


def _regular_or_missing(path: Path, real: Path) -> os.stat_result | None:
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise MemfitError(f"{path}: is a folder; memfit writes only regular files (use --out DIR for a folder)")
    if not stat.S_ISREG(st.st_mode):
        raise MemfitError(f"{path}: is not a regular file (a device, pipe or socket); memfit writes only regular files")
    return st


def _read(real: Path) -> bytes:
    with open(real, "rb") as f:
        return f.read()


def _unchanged_since_read(path: Path, old: bytes | None, expect) -> None:
    if expect is UNCHECKED:
        return
    if expect is None:
        if old is not None:
            raise MemfitError(f"{path}: a file memfit meant to create already exists; move it away or use --out")
        return
    if old is None or _as_read(old) != expect:
        raise MemfitError(f"{path}: changed on disk while memfit was planning; run memfit fit again")


def _as_read(data: bytes) -> str | None:
    """The text Path.read_text gave memfit (universal newlines)."""
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        return None


def _encode(text: str, old: bytes | None) -> bytes:
    # memfit edits text read with universal newlines: a file with Windows line ends keeps them, so the
    # only bytes that change are the ones the diff showed
    if old is not None and b"\r\n" in old and "\r\n" not in text:
        text = text.replace("\n", "\r\n")
    return text.encode("utf-8")


def _no_two_writes_to_one_file(targets: list[_Target]) -> None:
    seen: dict[Path, Path] = {}
    for t in targets:
        key = t.real.absolute()
        if key in seen:
            raise MemfitError(f"{t.write.path} and {seen[key]} are the same file; memfit would write it twice "
                              "(use --out with another folder)")
        seen[key] = t.write.path


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


# --- writing --------------------------------------------------------------------------------------------

def _make_folders(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; return the ones created, outermost first (to undo)."""
    missing = []
    for p in [folder, *folder.parents]:
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
    return list(reversed(missing))


def _stage(real: Path, data: bytes, mode: int) -> Path:
    """`data` in a new temporary file beside `real` (same file system, so the rename is atomic), on disk."""
    fd, name = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".memfit-tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)  # mkstemp makes 0600; the target keeps its own permission bits
            os.fsync(f.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _save_backup(real: Path, data: bytes, mode: int) -> Path:
    """The original's bytes in the first free NAME.memfit-bak[.N]; O_EXCL so an existing backup is never replaced."""
    for n in range(1000):
        path = real.with_name(real.name + BACKUP_SUFFIX + (f".{n}" if n else ""))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path
    raise MemfitError(f"{real}: 1000 backups {real.name}{BACKUP_SUFFIX}.N already exist; remove some")


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a folder; the data itself is already on disk
    finally:
        os.close(fd)


# --- undoing ----------------------------------------------------------------------------------------------

def _roll_back(todo: list[_Target], made: list[Path]) -> str:
    """Put every file back as it was; returns "" or one sentence naming what could not be put back."""
    lost = []
    for t in reversed(todo):
        if t.temp is not None and not t.replaced:
            t.temp.unlink(missing_ok=True)
        if t.replaced and not _restore(t):
            lost.append(f"{t.real} (its original is in {t.backup})" if t.backup else str(t.real))
            continue
        if t.backup is not None:
            t.backup.unlink(missing_ok=True)
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty: something else put a file there
    return f"could not restore {', '.join(lost)}" if lost else ""


def _restore(t: _Target) -> bool:
    try:
        if t.old is None:
            t.real.unlink(missing_ok=True)
            return True
        temp = _stage(t.real, t.old, t.mode)
        try:
            os.replace(temp, t.real)
        except OSError:
            temp.unlink(missing_ok=True)
            # the file at t.real is memfit's own new one: rewriting it in place is safe when a rename is not possible
            with open(t.real, "wb") as f:
                f.write(t.old)
            os.chmod(t.real, t.mode)
        return True
    except OSError:
        return False

