"""A toolchain others can write is refused (#33 red team: ``toolchain.json``, in the toolchain's own directory, is
the only record of what was installed, so it vouches for nothing against whoever can write there). Like ssh's
StrictModes: the toolchain's directories up to the toolchains root, its state file and what runs must be the
user's (or root's) and not writable by group or others. Real files and modes; no toolchain is run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edge import toolchains


@pytest.fixture()
def tc_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "toolchains"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(root))
    return root


def _installed(root: Path, name: str) -> Path:
    d = root / name
    (d / "venv" / "bin").mkdir(parents=True)
    for p in (d, d / "venv", d / "venv" / "bin"):
        os.chmod(p, 0o755)
    (d / "toolchain.json").write_text(json.dumps({"packages": {}}))
    os.chmod(d / "toolchain.json", 0o644)
    return d


def _shared_gid() -> int:
    """A group that is not this user's private group (one another account may be in)."""
    import grp
    import pwd

    mine = pwd.getpwuid(os.getuid()).pw_gid
    for name in ("users", "nogroup", "staff", "adm"):
        try:
            g = grp.getgrnam(name)
        except KeyError:
            continue
        if g.gr_gid != mine:
            return g.gr_gid
    pytest.skip("hardware: no second group on this host to own a shared toolchain directory")


@pytest.mark.parametrize("name", ["tflite", "aarch64"])
def test_a_toolchain_others_can_write_is_not_usable(tc_root: Path, name: str) -> None:
    d = _installed(tc_root, name)
    os.chown(d, -1, _shared_gid())  # group-writable counts where the group is shared (a private one: below)
    before = toolchains.status(name)
    assert before.problem is not None and "not safe to run" not in before.problem, before.problem  # it is missing
    for path, mode, who in (
        (d / "toolchain.json", 0o646, "others"),
        (d, 0o775, "group"),
        (tc_root, 0o777, "others"),  # its group is this user's own (pytest's tmp): only others count
    ):
        old = path.stat().st_mode & 0o777
        os.chmod(path, mode)
        st = toolchains.status(name)
        assert not st.usable and st.problem is not None
        assert f"{path} is writable by {who}" in st.problem and "chmod " in st.problem, st.problem
        assert "\n" not in st.problem
        os.chmod(path, old)
    assert "not safe to run" not in (toolchains.status(name).problem or "")


def test_the_emulators_guest_dir_is_guarded(tc_root: Path) -> None:
    d = _installed(tc_root, "aarch64")
    guest = d / "guest"
    guest.mkdir(mode=0o755)
    os.chmod(guest, 0o757)  # a planted sitecustomize or edge link would run in every check
    st = toolchains.status("aarch64")
    assert st.problem is not None and f"{guest} is writable by others" in st.problem, st.problem


def test_umask_002_with_a_private_group_is_the_users_own(tc_root: Path) -> None:
    """Debian/Ubuntu give each user a group of their own and umask 002: group-writable there is the user's."""
    import grp
    import pwd

    me = pwd.getpwuid(os.getuid())
    if set(grp.getgrgid(me.pw_gid).gr_mem) - {me.pw_name}:
        pytest.skip("hardware: this user's primary group has other members")
    d = _installed(tc_root, "tflite")
    os.chown(d, -1, me.pw_gid)
    os.chmod(d, 0o775)
    assert "not safe to run" not in (toolchains.status("tflite").problem or "")
