"""Skips under CI=true: only missing hardware may skip (``tests/conftest.py`` polices it), and the alternate
signal stack check run after every test."""

from __future__ import annotations

import sys

# A skip whose reason starts with this is for hardware (or an OS) CI cannot have; any other skip fails under CI=true.
HARDWARE = "hardware: "


def ci_strict() -> bool:
    from edge.capabilities import env_flag

    return env_flag("CI")


def altstack_problem() -> str | None:
    """None when the calling thread has no alternate signal stack or it lies in mapped memory."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    class _Stack(ctypes.Structure):
        _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]

    ss = _Stack()
    if ctypes.CDLL(None, use_errno=True).sigaltstack(None, ctypes.byref(ss)) != 0 or ss.flags & 2 or not ss.sp:
        return None  # SS_DISABLE: handlers run on the thread's own stack
    lo, hi = int(ss.sp), int(ss.sp) + int(ss.size)
    covered = lo
    with open("/proc/self/maps") as f:
        spans = sorted(
            (int(a, 16), int(b, 16), perm) for a, b, perm in ((ln.split()[0].split("-") + [ln.split()[1]]) for ln in f)
        )
    for a, b, perm in spans:
        if a <= covered < b and "rw" in perm:
            covered = b
    if covered >= hi:
        return None
    return f"the main thread's alternate signal stack [{lo:#x}, {hi:#x}) is not mapped memory from {covered:#x} on"
