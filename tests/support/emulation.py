"""The emulated aarch64 device the ISA tests run on (``edgekit toolchain install aarch64``)."""

from __future__ import annotations

import platform
import sys

import pytest

from edge.toolchains import aarch64


def emulator_or_skip() -> aarch64.Emulator:
    """The installed emulator. A host that cannot emulate (not x86-64 Linux) skips as missing hardware; an
    x86-64 Linux host without the toolchain skips with the install command (a failure under CI=true, which
    installs it)."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"hardware: not an x86-64 Linux host ({sys.platform} {platform.machine()}): no aarch64 emulation")
    st = aarch64.status()
    if not st.usable:
        pytest.skip(st.problem or "toolchain 'aarch64' is not usable")
    return aarch64.require()
