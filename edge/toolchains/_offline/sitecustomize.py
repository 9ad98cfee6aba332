"""edgekit's in-process network guard, loaded by every Python process of a toolchain run.

Not part of the ``edge`` package API: :func:`edge.toolchains.offline_popen` puts this directory
on ``PYTHONPATH`` of a driver run, so Python imports this file at start-up (``site``), in the
driver and in every Python child it starts (onnxsim, ``python -c ...``) that inherits the
environment. It must only use the standard library (it runs in the toolchains' Pythons).

It refuses, for every socket that is not a local-IPC one (``AF_UNIX``, ``AF_NETLINK``), loopback
included: ``connect``/``connect_ex``/``sendto``/``sendmsg`` with an address, on ``socket.socket``
and on ``_socket.socket`` (which is replaced by a guarded subclass: the C type cannot be patched),
and ``socket.create_connection``. Each attempt is appended to ``$EDGEKIT_OFFLINE_ATTEMPTS``.

What it cannot stop (and why the launcher prefers a network namespace): native code calling the
C library's ``connect`` itself (TensorFlow's C++ code, curl), Python children started with ``-I``,
``-E`` or ``-S``, and non-Python children. ``HTTP(S)_PROXY`` pointing at a closed local port,
set by the launcher, turns most of those downloaders' attempts into a quick local failure.
"""

from __future__ import annotations

import errno
import os
import sys


def _install() -> None:
    import _socket
    import socket

    local = {getattr(_socket, n) for n in ("AF_UNIX", "AF_NETLINK") if hasattr(_socket, n)}
    log = os.environ.get("EDGEKIT_OFFLINE_ATTEMPTS", "")
    real_type = _socket.socket
    real_create_connection = socket.create_connection

    def refuse(what: str, address: object, fail: bool = True) -> int:
        line = f"{what} {address!r} (pid {os.getpid()}: {os.path.basename(sys.argv[0]) if sys.argv else '?'})"
        if log:
            try:
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
                finally:
                    os.close(fd)
            except OSError:
                pass
        if fail:
            raise OSError(
                errno.ENETUNREACH,
                f"edgekit: network access refused during conversion ({line}); toolchain runs are offline by design",
            )
        return errno.ENETUNREACH

    def connect(self: socket.socket, address: object) -> None:
        if self.family not in local:
            refuse("connect", address)
        return real_type.connect(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        if self.family not in local:
            return refuse("connect", address, fail=False)
        return real_type.connect_ex(self, address)

    def sendto(self: socket.socket, data: object, *args: object) -> int:
        if self.family not in local:  # sendto(data, address) or sendto(data, flags, address)
            refuse("sendto", args[-1] if args else None)
        return real_type.sendto(self, data, *args)

    def sendmsg(self: socket.socket, buffers: object, *args: object) -> int:
        if self.family not in local and len(args) >= 3 and args[2] is not None:  # (ancdata, flags, address)
            refuse("sendmsg", args[2])
        return real_type.sendmsg(self, buffers, *args)

    def create_connection(address: object, *args: object, **kwargs: object) -> socket.socket:
        refuse("create_connection", address)
        return real_create_connection(address, *args, **kwargs)  # not reached

    methods = {"connect": connect, "connect_ex": connect_ex, "sendto": sendto, "sendmsg": sendmsg}
    for name, fn in methods.items():
        setattr(socket.socket, name, fn)  # socket.socket is a Python subclass of _socket.socket
    guarded = type("socket", (real_type,), {**methods, "__module__": "_socket", "__slots__": ()})
    _socket.socket = guarded  # type: ignore[misc]
    _socket.SocketType = guarded  # type: ignore[attr-defined]
    socket.create_connection = create_connection  # type: ignore[assignment]


def _chain() -> None:
    """Run the sitecustomize this file shadows (a distribution's own), if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
try:
    _chain()
except Exception:  # noqa: BLE001 - a broken distribution hook must not stop the guarded run
    pass
