"""Shipping over ssh:// against a real sshd on a loopback port (key auth, temporary config).

The ssh store must behave as the local one: same layout and records, same refusals, and the same
recovery of a store a killed writer left behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge.bundle.bundle import Bundle
from edge.deploy import rollback, ship
from edge.errors import DeployError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.store import INSTALL_STEPS, DeviceStore, SshStore
from tests.support.cli import assert_user_error, run_cli
from tests.support.sshd_server import Sshd, needs_sshd, sshd  # noqa: F401  (sshd: the fixture)
from tests.support.store_bundles import KillServer, clone_bundle

pytestmark = needs_sshd


@pytest.fixture(scope="module")
def abc(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    d = tmp_path_factory.mktemp("ssh-src")
    base = convert(models["tiny"], "x86-cpu", d / "base")
    return {n: clone_bundle(base, d, n) for n in "ABC"}


def test_ship_verify_switch_and_rollback_over_ssh(models: dict[str, Path], tmp_path: Path, sshd: Sshd) -> None:
    remote = tmp_path / "remote-store"
    url = sshd.url(remote)
    a = convert(models["tiny"], "x86-cpu", tmp_path / "a")
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(precision="fp16"))
    assert ship(a, url) == f"root@127.0.0.1:{remote}/bundles/{a.id}"
    assert os.readlink(remote / "current") == f"bundles/{a.id}"
    ship(b, url)
    assert os.readlink(remote / "current") == f"bundles/{b.id}"
    assert os.readlink(remote / "previous") == f"bundles/{a.id}"
    Bundle.open(remote / "bundles" / b.id)  # exactly its files, every hash
    assert oct((remote / "bundles" / b.id).stat().st_mode & 0o777) == "0o755"
    assert not [p for p in (remote / "bundles").iterdir() if p.name.startswith(".")]
    assert rollback(url) == a.id
    assert os.readlink(remote / "current") == f"bundles/{a.id}"
    store = SshStore(url, options=sshd.option_list())
    assert (store.current, store.previous) == (a.id, b.id)
    assert [(e["action"], e["current"]) for e in store.history()] == [
        ("deploy", a.id),
        ("deploy", b.id),
        ("rollback", a.id),
    ]
    assert store.history() == DeviceStore(remote).history()
    for line in (remote / "history.jsonl").read_text().splitlines():  # the device writes what Python writes
        assert json.dumps(json.loads(line)) == line
    p = run_cli("rollback", "--device", url, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["current"] == b.id


def test_corrupted_transfer_is_not_switched_to(models: dict[str, Path], tmp_path: Path, sshd: Sshd) -> None:
    remote = tmp_path / "remote-store"
    a = convert(models["tiny"], "x86-cpu", tmp_path / "a")
    ship(a, sshd.url(remote))
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(precision="fp16"))
    manifest = json.loads(json.dumps(b.manifest))
    manifest["artifacts"][0]["sha256"] = "0" * 64  # what the device must check against
    store = SshStore(sshd.url(remote), options=sshd.option_list())
    with pytest.raises(DeployError, match="failed sha256 verification on the device"):
        store.install(Bundle(b.path, manifest))
    assert os.readlink(remote / "current") == f"bundles/{a.id}"
    assert sorted(p.name for p in (remote / "bundles").iterdir()) == [a.id]  # no partial left behind


def test_attack_1_a_shell_payload_in_the_bundle_id_runs_nothing(
    abc: dict[str, Bundle], tmp_path: Path, sshd: Sshd
) -> None:
    """`x$(id>PWNED)` as a bundle id once ran `id` on the device (the history line's printf)."""
    remote = tmp_path / "remote-store"
    store = SshStore(sshd.url(remote), options=sshd.option_list())
    store.install(abc["A"])
    places = [remote, remote / "bundles", tmp_path, Path.home(), Path("/")]
    for payload in ("x$(id>PWNED)", "x`id>PWNED`", "x;id>PWNED"):
        fake = SimpleNamespace(id=payload, path=abc["B"].path, manifest=abc["B"].manifest, info=abc["B"].info)
        with pytest.raises(DeployError, match="refusing bundle id"):  # refused before any connection
            store.install(fake)
        # and had it got through, the device takes it as a value, never as shell text
        rc, _, err = store._call("install", "5", payload, "0", "0" * 64, "manifest.json")
        assert rc == 66 and "bad arguments: bundle id" in err
        rc, _, err = store._call("manifest", payload)
        assert rc == 66
    assert not [p for p in places if (p / "PWNED").exists()]
    assert sorted(p.name for p in (remote / "bundles").iterdir()) == ["A"]
    assert DeviceStore(remote).history()[-1]["current"] == "A"


def test_two_concurrent_ssh_deploys_of_one_bundle_both_succeed(
    abc: dict[str, Bundle], tmp_path: Path, sshd: Sshd
) -> None:
    remote = tmp_path / "remote-store"
    results: list[object] = []

    def go() -> None:
        try:
            results.append(SshStore(sshd.url(remote), options=sshd.option_list()).install(abc["A"]))
        except Exception as e:  # noqa: BLE001 - reported below
            results.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r for r in results if isinstance(r, Exception)] == [] and len(results) == 2
    assert [e.get("note") for e in DeviceStore(remote).history()] == [None, "already current"]
    assert sorted(p.name for p in (remote / "bundles").iterdir()) == ["A"]


def test_a_held_lock_makes_an_ssh_writer_report_busy(abc: dict[str, Bundle], tmp_path: Path, sshd: Sshd) -> None:
    remote = tmp_path / "remote-store"
    remote.mkdir()
    with open(remote / ".lock", "w") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DeployError, match=r"is busy: another deploy or rollback \(pid 4242\)"):
            SshStore(sshd.url(remote), options=sshd.option_list(), lock_timeout=1).install(abc["A"])
    assert not (remote / "current").exists()


def test_a_damaged_store_reads_the_same_over_ssh(abc: dict[str, Bundle], tmp_path: Path, sshd: Sshd) -> None:
    remote = tmp_path / "remote-store"
    local = DeviceStore(remote)
    local.install(abc["A"])
    local.install(abc["B"])
    os.unlink(remote / "current")
    (remote / "current").mkdir()
    url = sshd.url(remote)
    store = SshStore(url, options=sshd.option_list())
    for op in (lambda s: s.install(abc["C"]), lambda s: s.rollback(), lambda s: s.current):
        with pytest.raises(DeployError) as over_ssh:
            op(store)
        with pytest.raises(DeployError) as here:
            op(local)
        assert str(over_ssh.value).replace(url, "STORE") == str(here.value).replace(str(remote), "STORE")
        assert "is damaged: 'current' is a directory" in str(over_ssh.value)
    assert_user_error(run_cli("rollback", "--device", url), "is damaged", "'current' is a directory")


def test_ssh_recovers_a_killed_local_writer_exactly_as_local_does(
    abc: dict[str, Bundle], tmp_path: Path, sshd: Sshd
) -> None:
    """The device script's recovery agrees with DeviceStore's, at every kill point of an install."""
    killer = KillServer(abc["A"].path)
    try:
        template = tmp_path / "template"
        assert killer.run(template, str(abc["B"].path), "-", [abc["A"].path]) == 0
        # one kill point per distinct state left behind (a partial, a whole unnamed stage, then each switch step)
        for step in ("copy", "rename", "intent", "previous", "current", "commit", "finish"):
            assert step in INSTALL_STEPS
            twin_local, twin_ssh = tmp_path / f"{step}-local", tmp_path / f"{step}-ssh"
            shutil.copytree(template, twin_local, symlinks=True)
            assert killer.run(twin_local, str(abc["C"].path), step, []) == -signal.SIGKILL
            shutil.copytree(twin_local, twin_ssh, symlinks=True)  # the same killed state, twice
            local, remote = DeviceStore(twin_local), SshStore(sshd.url(twin_ssh), options=sshd.option_list())
            assert remote.state() == local.state(), step
            assert remote.history() == local.history(), step
            expected = "B" if local.current == "C" else "A"
            assert remote.rollback() == local.rollback() == expected, step
            assert remote.state() == local.state() == DeviceStore(twin_ssh).state(), step
            strip = [{k: v for k, v in e.items() if k not in ("time", "txn")} for e in local.history()]
            assert [{k: v for k, v in e.items() if k not in ("time", "txn")} for e in remote.history()] == strip, step
            assert sorted(p.name for p in (twin_ssh / "bundles").iterdir()) == sorted(
                p.name for p in (twin_local / "bundles").iterdir()
            )
            assert remote.install(abc["C"]) and remote.current == "C"
    finally:
        killer.close()
