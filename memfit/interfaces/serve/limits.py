"""The request guards of `memfit serve`, as plain ASGI (no web framework), each answering memfit's one-line error
before the app sees the request:

- SameOrigin: the API has no login, so it answers only its own page on this machine. A Host header that is not a
  localhost name or the bound address is refused (a DNS-rebinding page would send its own name); an Origin that
  is not this server's is refused (any web page the user visits can POST here, and a text/plain POST needs no
  CORS preflight); a body that is not Content-Type application/json is refused.
- BodyLimit: a body over the limit is refused with 413 before any of it is parsed, whether it says its length
  (Content-Length) or streams in chunks."""
from __future__ import annotations

import json
from collections.abc import Iterable

MAX_BODY = 2**20  # 1 MiB: a framework config or a config.json is a few KB
MAX_MESSAGE = 500  # characters of an error line (a quoted value may be long)
# line breaks inside a quoted value, shown escaped as cli/main.py::one_line does (importing it would make a cycle:
# main -> cli/serve -> serve/app -> here)
_ESCAPED = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def error_body(message: str, field: str | None = None) -> dict:
    """memfit's error document: one line (a value's line break shown escaped, as the command line does)."""
    line = message.strip().translate(_ESCAPED)
    return {"error": line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "...", "field": field}


class BodyLimit:
    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self._refuse(send)
        chunks, size = [], 0
        while True:  # read it all (up to the limit) before the app sees any of it
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send):
        await send_error(send, 413, f"the request body is over the server's limit of {self.limit:,} bytes")


async def send_error(send, status: int, message: str) -> None:
    """memfit's error document as the whole answer, and the connection closed (the body may be unread)."""
    text = json.dumps(error_body(message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(text)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": text})


LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
BODY_TYPES = ("application/json",)  # no endpoint reads a form or multipart body: uploads come as JSON text
SAFE_METHODS = ("GET", "HEAD")


def host_name(host: str) -> str:
    """A Host header's name without its port, lower case: "[::1]:8000" -> "::1", "Example:80" -> "example"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _arrived_at(scope, name: str) -> bool:
    """Whether `name` is the IP address this connection came in on (a server bound to 0.0.0.0 is reached at
    each of the machine's addresses; a rebinding page sends a name, never the address)."""
    import ipaddress

    local = (scope.get("server") or ("",))[0] or ""
    try:
        return ipaddress.ip_address(local) == ipaddress.ip_address(name)
    except ValueError:  # not an IP literal (TestClient's "testserver", a name)
        return False


class SameOrigin:
    def __init__(self, app, allowed_hosts: Iterable[str] = ()):
        self.app = app
        self.hosts = LOCAL_HOSTS | {host_name(h) for h in allowed_hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal:
            return await send_error(send, *refusal)
        await self.app(scope, receive, send)

    def refusal(self, scope) -> tuple[int, str] | None:
        from memfit.interfaces.formats.base import shown

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if host_name(host) not in self.hosts and not _arrived_at(scope, host_name(host)):
            return 403, (f"Host {shown(host)} is not this server's address; open the page at one of: "
                         f"{', '.join(sorted(self.hosts))} (memfit serve answers only its own page)")
        origin, own = headers.get("origin"), f"{scope.get('scheme', 'http')}://{host}".lower()
        if origin is not None and origin.strip().lower() != own:
            return 403, (f"cross-origin request refused: Origin {shown(origin)} is not this server ({own}); the API "
                         "answers only its own page")
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if scope["method"] not in SAFE_METHODS and media not in BODY_TYPES:
            return 415, f"the API takes JSON bodies: send Content-Type: application/json (got {shown(media or None)})"
        return None
