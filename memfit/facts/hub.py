"""A model the catalog does not list, read from the Hugging Face hub: its config.json and, where the hub or the
local HF cache has it, the parameter count of its safetensors (a check of memfit's own count).

`huggingface_hub` is an optional extra (memfit[hub]), imported only inside these functions so the core runs
without it. The library itself honours HF_TOKEN, HF_HOME / HF_HUB_CACHE, HF_ENDPOINT and HF_HUB_OFFLINE and keeps
what it downloads in its cache across processes. Offline (HF_HUB_OFFLINE, or one short connect to the hub failing)
memfit reads the cache only, so a lookup never waits on the library's retries. memfit only adds `hub.json` in its
own cache folder for the counts the hub's API gave, so a count asked for once is not asked for again.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import struct
import threading
from contextlib import contextmanager
from pathlib import Path

from memfit.errors import MemfitError

# "org/name" or "org/name@revision"; the library validates the id itself, this only tells a hub id from a typo
_HUB_ID = re.compile(r"[\w][\w.-]*/[\w.-]+(@\S+)?")
# safetensors' own reader refuses longer headers; a longer one is not a safetensors file
_MAX_HEADER = 100 * 2**20
# seconds one TCP connect to the hub (or its proxy) may take before memfit reads the cache only: the library's own
# retries of an unreachable hub take ~25 s, in silence, before the same error
REACH_TIMEOUT = 1.5


class HubError(MemfitError):
    """The hub could not give a repo's config.json; the message says why and what to do about it."""


def looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.fullmatch(name.strip()))


def split_id(name: str) -> tuple[str, str | None]:
    repo_id, _, revision = name.strip().partition("@")
    return repo_id, revision or None


def config_path(repo_id: str, revision: str | None) -> Path:
    """The repo's config.json in the HF cache, downloaded first if the library may and must."""
    return repo_file(repo_id, "config.json", revision, "pass a config.json")


def repo_file(repo_id: str, filename: str, revision: str | None, instead: str) -> Path:
    """One file of the repo in the HF cache (config.json, tokenizer.json), downloaded first if the library may and
    must; `instead` says what the user can give rather than install the extra."""
    try:
        import huggingface_hub
    except ImportError:
        raise HubError(f"install memfit[hub] to read it from the Hugging Face hub, or {instead}") from None
    download = huggingface_hub.hf_hub_download  # imported lazily: the import sets the library's log level
    try:
        with _library_quiet():
            return Path(download(repo_id, filename, revision=revision, local_files_only=_offline()))
    except Exception as e:  # noqa: BLE001 - every failure of the library becomes one line naming the fix
        raise HubError(_explain(e, repo_id, revision, filename)) from None


@contextmanager
def _library_quiet():
    """The library logs a warning per retry of an unreachable hub; memfit says the outcome in one line instead."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _explain(e: Exception, repo_id: str, revision: str | None, filename: str = "config.json") -> str:
    from huggingface_hub import constants, errors

    if isinstance(e, errors.GatedRepoError):
        return f"{repo_id} is gated on the Hugging Face hub: accept its terms at https://huggingface.co/{repo_id} and set HF_TOKEN"
    if isinstance(e, errors.RepositoryNotFoundError):  # the hub answers the same for a private repo without a token
        return f"the Hugging Face hub has no repo {repo_id} you can read (private or gated: set HF_TOKEN)"
    if isinstance(e, errors.RevisionNotFoundError):
        return f"the Hugging Face hub repo {repo_id} has no revision {revision!r}"
    if isinstance(e, errors.LocalEntryNotFoundError):
        if constants.is_offline_mode():
            return (f"offline: using the HF cache only: HF_HUB_OFFLINE is set and {repo_id} is not in the HF cache "
                    f"({constants.HF_HUB_CACHE}); unset it to download, or pass a config.json")
        return (f"offline: using the HF cache only: cannot reach the Hugging Face hub ({_address()[0]}) for {repo_id} "
                f"and it is not in the HF cache ({constants.HF_HUB_CACHE}); check the network (or proxy), or pass "
                f"a config.json")
    if isinstance(e, errors.EntryNotFoundError):
        return f"the Hugging Face hub repo {repo_id} has no {filename}"
    if isinstance(e, errors.HFValidationError):
        return f"{repo_id!r} is not a valid Hugging Face hub id ({_first_line(e)})"
    if isinstance(e, errors.HfHubHTTPError) and getattr(e.response, "status_code", None) == 401:
        return f"the Hugging Face hub refused {repo_id} (401 unauthorized): set HF_TOKEN to a valid token"
    return f"reading {repo_id} from the Hugging Face hub failed: {type(e).__name__}: {_first_line(e)}"


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def param_count(repo_id: str, config: Path) -> int | None:
    """Parameters the repo's safetensors hold at the commit `config` was read from; None when not known.

    From, in order: memfit's hub.json, the safetensors headers already in the HF cache (exact, no network), the
    hub's API (one request, skipped offline). The count only checks memfit's own, so a failure leaves it unknown."""
    snapshot = config.parent  # <cache>/models--org--name/snapshots/<commit>/config.json
    key = f"{repo_id}@{snapshot.name}"
    known = _read_counts()
    if key in known and (known[key] is None or type(known[key]) is int):  # anything else: a damaged file, ignored
        return known[key]
    local = _cached_count(snapshot)
    if local is not None or _offline():
        return local
    try:
        count = _api_count(repo_id, snapshot.name)
    except Exception:  # noqa: BLE001 - network or API trouble: the count is optional, the config was read
        return None
    _save_count(key, count)  # None too: a repo without safetensors is not asked again
    return count


def _offline() -> bool:
    """HF_HUB_OFFLINE, or a hub this process found unreachable: then only the HF cache is read."""
    from huggingface_hub import constants

    return constants.is_offline_mode() or not _reachable(*_address())


def _address() -> tuple[str, int]:
    """Where a request to the hub first connects: the proxy the library would use, else the endpoint's host
    (HF_ENDPOINT: a mirror)."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    proxy = getproxies().get(url.scheme) if url.hostname and not proxy_bypass(url.hostname) else None
    if proxy:
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


_reach: dict[tuple[str, int], bool] = {}  # once per process: a second lookup does not wait again


def _reachable(host: str, port: int) -> bool:
    """One TCP connect within REACH_TIMEOUT, name lookup included (getaddrinfo has no timeout of its own, so the
    connect runs in a thread that is left behind if it hangs)."""
    if (host, port) not in _reach:
        done: list[bool] = []

        def connect() -> None:
            try:
                socket.create_connection((host, port), timeout=REACH_TIMEOUT).close()
                done.append(True)
            except OSError:
                done.append(False)

        worker = threading.Thread(target=connect, daemon=True)
        worker.start()
        worker.join(REACH_TIMEOUT + 0.1)
        _reach[(host, port)] = done[:1] == [True]  # still hanging: unreachable
    return _reach[(host, port)]


def _api_count(repo_id: str, commit: str) -> int | None:
    """The total the hub computed from the safetensors headers (its "Model size"), for that exact commit."""
    from huggingface_hub import HfApi

    api = HfApi()
    with _library_quiet():
        info = api.model_info(repo_id, revision=commit, expand=["safetensors"])
    return info.safetensors.total if info.safetensors else None


def _cached_count(snapshot: Path) -> int | None:
    """Sum of the tensor shapes in the cached safetensors; None unless every shard is there (a partial download
    would count short)."""
    single = snapshot / "model.safetensors"
    if single.is_file():
        return _header_count(single)
    index = snapshot / "model.safetensors.index.json"
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    counts = [_header_count(snapshot / s) if (snapshot / s).is_file() else None for s in sorted(shards)]
    known = [c for c in counts if c is not None]
    return sum(known) if shards and len(known) == len(counts) else None


def _header_count(file: Path) -> int | None:
    """Parameters in one safetensors file, from its header alone: 8 bytes of header length, then JSON of
    {tensor: {dtype, shape, data_offsets}} (https://github.com/huggingface/safetensors#format)."""
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > _MAX_HEADER:
                return None
            header = json.loads(f.read(size))
        return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def _counts_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "memfit" / "hub.json"


def _read_counts() -> dict:
    try:
        data = json.loads(_counts_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_count(key: str, count: int | None) -> None:
    path = _counts_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # write then rename: a concurrent reader never sees half a file
        tmp.write_text(json.dumps({**_read_counts(), key: count}, indent=0, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache folder only costs asking the hub again next time
