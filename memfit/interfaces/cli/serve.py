"""`memfit serve`: the local web app and its JSON API (memfit/interfaces/serve/). Registered by
memfit/interfaces/cli/main.py::build_parser through `add_serve_command(sub)`.

fastapi and uvicorn are the optional extra memfit[serve]: imported here, when the command runs, so the rest of
memfit runs without them.
"""
from __future__ import annotations

import argparse
import ipaddress
import socket
import sys

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
    p.add_argument("--allow-remote", action="store_true",
                   help="start even when --host is reachable from other machines (anyone who reaches it can use the API)")
    p.set_defaults(run=run_serve)


def run_serve(a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from memfit.interfaces.serve.app import create_app
    except ImportError as e:
        raise MemfitError(f"memfit serve needs FastAPI and uvicorn ({e.name} is missing): pip install 'memfit[serve]'") from None
    warning = check_remote(a.host, a.allow_remote)
    _check_free(a.host, a.port)
    if warning:
        print(f"memfit serve: warning: {warning}", file=sys.stderr)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"memfit serve: http://{shown}:{a.port}/ (API under /api, description at /openapi.json; Ctrl-C stops)")
    uvicorn.run(create_app(allowed_hosts=served_names(a.host)), host=a.host, port=a.port, log_level="warning")
    return 0


def check_remote(host: str, allow_remote: bool) -> str | None:
    """None for a loopback --host; for any other, the warning to print with --allow-remote, else refuse to start:
    the API has no login, so other machines (and pages they serve) could run it."""
    if _loopback(host):
        return None
    risk = f"--host {host} is reachable from other machines and the API has no login"
    if not allow_remote:
        raise MemfitError(f"{risk}; add --allow-remote to start anyway, or leave --host at 127.0.0.1")
    return f"{risk}: anyone who can reach it can use it"


def _loopback(host: str) -> bool:
    """Whether every address `host` names is this machine's loopback (127.0.0.0/8, ::1)."""
    try:
        addresses = {a for info in socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
                     if isinstance(a := info[4][0], str)}  # an IP family's address is a str
    except OSError:
        raise MemfitError(f"cannot listen on {host}: no such address (give an IP address or a name this machine "
                          "resolves)") from None
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def served_names(host: str) -> tuple[str, ...]:
    """The Host names the app answers besides localhost: the bound one, and for a wildcard address (0.0.0.0, ::)
    this machine's name and addresses, the names other machines reach it by."""
    if host.strip("[]") not in ("0.0.0.0", "::", ""):
        return (host,)
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names |= {a for name in list(names) for info in socket.getaddrinfo(name, None)
                  if isinstance(a := info[4][0], str)}  # an IP family's address is a str
    except OSError:
        pass  # a name that does not resolve: reached by its name only
    return tuple(sorted(names))


def _check_free(host: str, port: int) -> None:
    """A busy port or an unknown address in one line (uvicorn logs it over several and exits 1)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise MemfitError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
