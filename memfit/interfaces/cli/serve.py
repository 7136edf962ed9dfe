"""`memfit serve`: the local web app and its JSON API (memfit/interfaces/serve/). Registered by
memfit/interfaces/cli/main.py::build_parser through `add_serve_command(sub)`.

fastapi and uvicorn are the optional extra memfit[serve]: imported here, when the command runs, so the rest of
memfit runs without them.
"""
from __future__ import annotations

import argparse
import socket

from memfit.errors import MemfitError
from memfit.interfaces.cli.args import whole_number


def port_number(text: str) -> int:
    value = whole_number(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
    return value


def add_serve_command(subparsers) -> None:
    p = subparsers.add_parser("serve", help="a local web app and JSON API (needs memfit[serve]): form, live "
                                            "estimate and charts, config export")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (default 8000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; the API has no login)")
    p.set_defaults(run=run_serve)


def run_serve(a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from memfit.interfaces.serve.app import create_app
    except ImportError as e:
        raise MemfitError(f"memfit serve needs FastAPI and uvicorn ({e.name} is missing): pip install 'memfit[serve]'") from None
    _check_free(a.host, a.port)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"memfit serve: http://{shown}:{a.port}/ (API under /api, description at /openapi.json; Ctrl-C stops)")
    uvicorn.run(create_app(), host=a.host, port=a.port, log_level="warning")
    return 0


def _check_free(host: str, port: int) -> None:
    """A busy port or an unknown address in one line (uvicorn logs it over several and exits 1)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise MemfitError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
