"""The request size limit of `memfit serve`, as plain ASGI (no web framework): a body over the limit is refused with
413 before any of it is parsed, whether it says its length (Content-Length) or streams in chunks."""
from __future__ import annotations

import json

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
        text = json.dumps(error_body(f"the request body is over the server's limit of {self.limit:,} bytes")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(text)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": text})
