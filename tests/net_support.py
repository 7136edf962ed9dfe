"""A free TCP port on 127.0.0.1 for the tests that start a server or a gloo process group."""
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
