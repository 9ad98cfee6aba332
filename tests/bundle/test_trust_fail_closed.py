"""Issue #26 item 5: a trust store that exists but cannot be read refuses everything, in one line.

Real keys, real signed bundles, real device stores. Each damage below used to turn a check off silently
(a wrong-typed versions.json: no anti-rollback; a dangling-symlink revoked.json: no revocation; ``trust``
as a file: no trust store at all).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from edge.bundle.bundle import MANIFEST, Bundle, sign_bundle
from edge.bundle.signing import generate_key
from edge.bundle.trust import TrustStore
from edge.deploy import ship
from edge.errors import SignatureError
from edge.pipeline import convert
from edge.store import DeviceStore

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("trust-base") / "b").path


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "keys"
    monkeypatch.setenv("EDGEKIT_KEYS_DIR", str(d))
    monkeypatch.delenv("EDGEKIT_TRUST_DIR", raising=False)
    monkeypatch.delenv("EDGEKIT_SIGN_KEY", raising=False)
    generate_key("k")
    return d


def signed(built: Path, tmp_path: Path, name: str, version: int) -> Path:
    d = tmp_path / "src" / name
    shutil.copytree(built, d)
    m = json.loads((d / MANIFEST).read_text())
    m["bundle_id"] = f"tiny-{name}"
    (d / MANIFEST).write_text(json.dumps(m, indent=2))
    sign_bundle(d, "k", version=version)
    return d


def trusting_store(tmp_path: Path, keys: Path) -> Path:
    store = tmp_path / "device"
    TrustStore(store / "trust").add_key((keys / "k.pub").read_bytes(), "k")
    return store


def _wrong_typed_versions(trust: Path) -> None:
    (trust / "versions.json").write_text(json.dumps({"tiny-x86-cpu": {"version": "9"}}))


def _versions_a_list(trust: Path) -> None:
    (trust / "versions.json").write_text(json.dumps({"tiny-x86-cpu": ["9"]}))


def _dangling_revoked(trust: Path) -> None:
    os.symlink(trust / "nowhere.json", trust / "revoked.json")


def _revoked_a_directory(trust: Path) -> None:
    (trust / "revoked.json").mkdir()


def _revoked_a_fifo(trust: Path) -> None:
    os.mkfifo(trust / "revoked.json")


def _device_a_list(trust: Path) -> None:
    (trust / "device.json").write_text("[]")


def _key_meta_a_list(trust: Path) -> None:
    for pub in (trust / "keys").glob("*.pub"):
        pub.with_suffix(".json").write_text('["2000-01-01T00:00:00+00:00"]')


@pytest.mark.parametrize(
    "damage",
    [
        _wrong_typed_versions,
        _versions_a_list,
        _dangling_revoked,
        _revoked_a_directory,
        _revoked_a_fifo,
        _device_a_list,
        _key_meta_a_list,
    ],
)
def test_a_damaged_trust_store_refuses_every_bundle(
    built: Path, tmp_path: Path, keys: Path, damage: Callable[[Path], None]
) -> None:
    store = trusting_store(tmp_path, keys)
    good = signed(built, tmp_path, "v5", 5)
    damage(store / "trust")
    with pytest.raises(SignatureError, match="is damaged") as e:
        ship(good, store)
    assert "\n" not in str(e.value)
    assert not (store / "current").exists()
    with pytest.raises(SignatureError, match="is damaged"):
        Bundle.open(good, trust=store / "trust")


def test_trust_being_a_file_refuses_everything(built: Path, tmp_path: Path, keys: Path) -> None:
    store = tmp_path / "device"
    store.mkdir()
    (store / "trust").write_text("not a directory")
    unsigned = tmp_path / "unsigned"
    shutil.copytree(built, unsigned)
    with pytest.raises(SignatureError, match="is damaged: it is not a directory"):
        DeviceStore(store)
    with pytest.raises(SignatureError, match="is damaged"):
        ship(unsigned, store)
    assert not (store / "current").exists()


def test_a_dangling_trust_link_refuses_everything(built: Path, tmp_path: Path) -> None:
    store = tmp_path / "device"
    store.mkdir()
    os.symlink(tmp_path / "gone", store / "trust")
    with pytest.raises(SignatureError, match="is damaged"):
        DeviceStore(store)


def test_anti_rollback_still_holds_with_a_sound_versions_file(built: Path, tmp_path: Path, keys: Path) -> None:
    store = trusting_store(tmp_path, keys)
    ship(signed(built, tmp_path, "v5", 5), store)
    with pytest.raises(SignatureError, match="older than version 5"):
        ship(signed(built, tmp_path, "v4", 4), store)
