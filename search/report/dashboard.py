"""Serves ``optuna-dashboard`` on a study storage, on loopback unless told otherwise."""

from __future__ import annotations

import ipaddress
import socket

from search.record.storage import open_storage

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (``127.0.0.0/8``, ``::1``, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def serve(storage_url: str, host: str = LOOPBACK, port: int = 8080) -> None:
    """Blocks, serving the dashboard for every study in ``storage_url``."""
    from optuna_dashboard import run_server

    run_server(open_storage(storage_url), host=host, port=port)
