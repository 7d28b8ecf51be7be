"""systemd's service notification protocol (sd_notify(3)), for ``Type=notify`` units.

A service started by systemd with ``NotifyAccess`` finds ``NOTIFY_SOCKET`` in its
environment: a datagram socket (a path, or ``@name`` in the abstract namespace) to which
it sends ``READY=1`` once it serves (so ``systemctl start`` and units ordered after it
wait for the models to load, not just for the process), ``STATUS=...`` (shown by
``systemctl status``), ``WATCHDOG=1`` at least every ``WATCHDOG_USEC`` / 2 (systemd
restarts a service that stops pinging) and ``STOPPING=1``.

Written here rather than taken from a library: the protocol is one datagram (systemd's
sd_notify(3) gives a reference implementation of the same size), ``systemd-python`` needs
libsystemd's headers to build, and ``sdnotify`` has not been maintained since 2017.
Outside systemd every call is a no-op.
"""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "watchdog_interval"]


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``, ...) to systemd; whether it was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or not fields:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # the abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
    except OSError:  # systemd went away, or the socket is not ours to use: the service goes on
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WatchdogSec=``), or None when the
    unit has no watchdog or it is meant for another process."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6
