"""Waiting for a server the tests started to listen on its loopback port."""

import socket
import time


def listening(port, seconds, pause):
    """Whether ``127.0.0.1:port`` accepts a connection within ``seconds``, tried every
    ``pause`` seconds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(pause)
    return False
