"""Signed bundles and a device trust store: real Ed25519 keys, real bundles, real stores (no mocks).

Where a trust store exists, ship (host and device side), ``Bundle.open`` and the agent refuse what
it does not vouch for; without one, nothing changes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from edge.agent.agent import Agent, AgentConfig
from edge.bundle.bundle import MANIFEST, SIGNATURE, Bundle, sign_bundle
from edge.bundle.signing import Signature, canonical_bytes, generate_key
from edge.bundle.trust import TrustStore
from edge.deploy import ship
from edge.errors import SignatureError
from edge.mqtt.client import BrokerConfig
from edge.pipeline import convert
from edge.store import DeviceStore, rollback
from tests.support.cli import assert_user_error, run_cli
from tests.support.sshd_server import Sshd, needs_sshd, sshd  # noqa: F401  (sshd: the fixture)

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("sign-base") / "b").path


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "keys"
    monkeypatch.setenv("EDGEKIT_KEYS_DIR", str(d))
    monkeypatch.delenv("EDGEKIT_TRUST_DIR", raising=False)
    monkeypatch.delenv("EDGEKIT_SIGN_KEY", raising=False)
    for name in ("old", "new", "stranger"):
        generate_key(name)
    return d


def copy(built: Path, tmp_path: Path, name: str, *, bundle_id: str | None = None) -> Path:
    d = tmp_path / "src" / name
    shutil.copytree(built, d)
    if bundle_id is not None:  # another bundle of the same series (name): same artifacts, another id
        m = json.loads((d / MANIFEST).read_text())
        m["bundle_id"] = bundle_id
        (d / MANIFEST).write_text(json.dumps(m, indent=2))
    return d


def device(tmp_path: Path, keys: Path, *trusted: str, target: str | None = "x86-cpu") -> Path:
    store = tmp_path / "device"
    ts = TrustStore(store / "trust")
    for k in trusted:
        ts.add_key((keys / f"{k}.pub").read_bytes(), k)
    if target:
        ts.set_targets([target])
    return store


def edit_manifest(bundle: Path, change) -> None:  # type: ignore[no-untyped-def]
    m = json.loads((bundle / MANIFEST).read_text())
    change(m)
    (bundle / MANIFEST).write_text(json.dumps(m, indent=1))


# -- the happy path -----------------------------------------------------------------------------


def test_signed_bundle_ships_to_a_trusting_store_and_opens(built: Path, tmp_path: Path, keys: Path) -> None:
    b = copy(built, tmp_path, "a")
    hashes = {a["path"]: a["sha256"] for a in json.loads((b / MANIFEST).read_text())["artifacts"]}
    r = sign_bundle(b, "new", version=7)
    assert (r.name, r.version) == ("tiny-x86-cpu", 7)
    signed = Bundle.open(b, trust=False)  # signing rewrote the manifest, never an artifact: hashes still hold
    assert {a.path: a.sha256 for a in signed.info.artifacts} == hashes
    assert (signed.info.name, signed.info.version) == ("tiny-x86-cpu", 7)
    sig = json.loads((b / SIGNATURE).read_text())
    assert set(sig) == {"algorithm", "key_id", "signature"} and sig["algorithm"] == "ed25519"
    assert sig["key_id"] == r.key_id and len(r.key_id) == 16
    # the signature is over the canonical bytes, not the file's layout: pretty-printing changes nothing
    edit_manifest(b, lambda m: None)
    store = device(tmp_path, keys, "new")
    dest = Path(ship(b, store))
    assert (dest / SIGNATURE).is_file()
    assert DeviceStore(store).bundle().id == signed.id  # the store opens current through its trust store
    assert Bundle.open(dest, trust=store / "trust").info.version == 7
    versions = json.loads((store / "trust" / "versions.json").read_text())
    assert versions["tiny-x86-cpu"]["version"] == 7


def test_canonical_bytes_are_sorted_compact_utf8() -> None:
    assert canonical_bytes({"b": 1, "a": {"é": [1.5, None]}}) == '{"a":{"é":[1.5,null]},"b":1}'.encode()


def test_without_a_trust_store_nothing_changes(
    built: Path, tmp_path: Path, keys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    b = copy(built, tmp_path, "a")
    with caplog.at_level("INFO", logger="edge.deploy"):
        ship(b, tmp_path / "plain")  # unsigned, no trust store: shipped as before
    assert "no trust store" in caplog.text
    assert DeviceStore(tmp_path / "plain").bundle().id == Bundle.open(b).id


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tamper", ["parity", "target"])
def test_a_manifest_edited_after_signing_is_refused(built: Path, tmp_path: Path, keys: Path, tamper: str) -> None:
    b = copy(built, tmp_path, "a")
    sign_bundle(b, "new")

    def change(m):  # type: ignore[no-untyped-def]
        if tamper == "parity":  # smaller errors than measured (still self-consistent for the gates)
            out = m["parity"]["outputs"][0]
            out["max_abs"], out["mean_abs"] = out["max_abs"] / 2 + 1e-9, out["mean_abs"] / 2 + 1e-9
        else:
            m["target"]["name"] = "jetson-orin"

    edit_manifest(b, change)
    store = device(tmp_path, keys, "new", target=None)
    with pytest.raises(SignatureError, match="signature does not match its manifest"):
        ship(b, store)
    with pytest.raises(SignatureError, match="signature does not match"):
        Bundle.open(b, trust=store / "trust")
    assert not (store / "current").exists()


def test_unsigned_untrusted_revoked_expired_and_other_target_are_refused(
    built: Path, tmp_path: Path, keys: Path
) -> None:
    store = device(tmp_path, keys, "new")
    ts = TrustStore(store / "trust")
    unsigned = copy(built, tmp_path, "unsigned")
    with pytest.raises(SignatureError, match="refusing unsigned bundle"):
        ship(unsigned, store)
    stranger = copy(built, tmp_path, "stranger")
    sign_bundle(stranger, "stranger")
    with pytest.raises(SignatureError, match="which the trust store .* does not hold"):
        ship(stranger, store)
    other = copy(built, tmp_path, "other")
    sign_bundle(other, "new")
    ts.set_targets(["jetson-orin"])
    with pytest.raises(SignatureError, match="built for target x86-cpu, this device runs jetson-orin"):
        ship(other, store)
    ts.set_targets(["x86-cpu"])
    ts.add_key((keys / "new.pub").read_bytes(), "new", not_after="2001-01-01T00:00:00+00:00")
    with pytest.raises(SignatureError, match="expired at 2001-01-01"):
        ship(other, store)
    ts.add_key((keys / "new.pub").read_bytes(), "new")  # expiry lifted
    ship(other, store)
    ts.revoke(Signature.read(other / SIGNATURE).key_id)  # type: ignore[union-attr]
    with pytest.raises(SignatureError, match="which is revoked"):
        ship(other, store)
    with pytest.raises(SignatureError, match="which is revoked"):  # and what is already current no longer opens
        DeviceStore(store).bundle()


def test_the_device_side_of_a_local_store_checks_on_its_own(built: Path, tmp_path: Path, keys: Path) -> None:
    """DeviceStore.install without ship's host-side check: the landed copy is checked, nothing left behind."""
    store = device(tmp_path, keys, "new")
    with pytest.raises(SignatureError, match="unsigned"):
        DeviceStore(store).install(Bundle.open(copy(built, tmp_path, "u")))
    assert not (store / "current").exists()
    assert [p.name for p in (store / "bundles").iterdir()] == []  # the staged copy is gone


def test_an_older_version_after_a_newer_one_is_refused(built: Path, tmp_path: Path, keys: Path) -> None:
    store = device(tmp_path, keys, "new")
    v1 = copy(built, tmp_path, "v1", bundle_id="tiny-v1")
    v2 = copy(built, tmp_path, "v2", bundle_id="tiny-v2")
    same = copy(built, tmp_path, "v2b", bundle_id="tiny-v2b")
    sign_bundle(v1, "new", version=1)
    sign_bundle(v2, "new", version=2)
    sign_bundle(same, "new", version=2)
    ship(v1, store)
    ship(v2, store)
    with pytest.raises(SignatureError, match="version 1 of tiny-x86-cpu is older than version 2"):
        ship(v1, store)
    with pytest.raises(SignatureError, match="version 2 of tiny-x86-cpu was already seen here as bundle tiny-v2"):
        ship(same, store)
    ship(v2, store)  # the same bundle again is fine
    # the operator may go back on the device; the agent then runs it, and only that one is allowed
    assert rollback(store) == "tiny-v1"
    assert DeviceStore(store).bundle().id == "tiny-v1"
    ship(v1, store)
    # the default version (seconds since the epoch) goes up by itself
    v3 = copy(built, tmp_path, "v3", bundle_id="tiny-v3")
    assert sign_bundle(v3, "new").version > 2
    ship(v3, store)
    with pytest.raises(SignatureError, match="older than"):
        ship(v1, store)  # the allowance ended with the newer deploy


def test_key_rotation_two_keys_trusted_then_the_old_one_revoked(built: Path, tmp_path: Path, keys: Path) -> None:
    store = device(tmp_path, keys, "old", "new")
    a = copy(built, tmp_path, "a", bundle_id="rot-a")
    b = copy(built, tmp_path, "b", bundle_id="rot-b")
    old_id = sign_bundle(a, "old", version=1).key_id
    sign_bundle(b, "new", version=2)
    ship(a, store)
    ship(b, store)  # both trusted during the overlap
    TrustStore(store / "trust").revoke(old_id)
    with pytest.raises(SignatureError, match="revoked"):  # the operator cannot roll back onto a revoked key's bundle
        rollback(store)
    assert DeviceStore(store).current == "rot-b"
    c = copy(built, tmp_path, "c", bundle_id="rot-c")
    sign_bundle(c, "old", version=3)
    with pytest.raises(SignatureError, match="revoked"):
        ship(c, store)
    sign_bundle(c, "new", version=3)  # re-signed with the new key: admitted
    ship(c, store)
    assert DeviceStore(store).bundle().id == "rot-c"


def test_recording_a_report_drops_the_stale_signature(built: Path, tmp_path: Path, keys: Path) -> None:
    b = copy(built, tmp_path, "a")
    sign_bundle(b, "new")
    Bundle.open(b).record("parity", Bundle.open(b).manifest["parity"])
    assert not (b / SIGNATURE).exists()


def test_the_agent_refuses_an_unsigned_bundle_when_trust_is_configured(built: Path, tmp_path: Path, keys: Path) -> None:
    store = tmp_path / "device"
    ship(copy(built, tmp_path, "u"), store)  # shipped before the device had a trust store
    broker = BrokerConfig("127.0.0.1", 1)
    ok = Agent(AgentConfig("lab", "cam-01", broker, store, source="none"))
    ok._load()  # no trust store: runs it as before
    assert ok.bundle is not None and ok.state == "idle"
    TrustStore(store / "trust").add_key((keys / "new.pub").read_bytes(), "new")
    agent = Agent(AgentConfig("lab", "cam-01", broker, store, source="none"))
    agent._load()
    assert agent.bundle is None and agent.state == "error"
    assert "refusing unsigned bundle" in (agent.state_detail or "")


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_keys_sign_trust_and_one_line_refusals(built: Path, tmp_path: Path) -> None:
    env = {"EDGEKIT_KEYS_DIR": str(tmp_path / "k"), "EDGEKIT_TRUST_DIR": "", "EDGEKIT_SIGN_KEY": ""}
    p = run_cli("keys", "generate", "ci", "--json", env=env)
    assert p.returncode == 0, p.stderr
    kid = json.loads(p.stdout)["key_id"]
    assert stat.S_IMODE(os.stat(tmp_path / "k" / "ci.pem").st_mode) == 0o600
    assert_user_error(run_cli("keys", "generate", "ci", env=env), "already exists")
    assert [k["key_id"] for k in json.loads(run_cli("keys", "list", "--json", env=env).stdout)] == [kid]
    pub = tmp_path / "ci.pub"
    assert run_cli("keys", "export", "ci", "-o", str(pub), env=env).returncode == 0
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    b = copy(built, tmp_path, "a")
    assert_user_error(run_cli("sign", str(b), env=env), "no key to sign with")
    assert_user_error(run_cli("sign", str(b), "--key", "nope", env=env), "no signing key 'nope'")
    store = tmp_path / "dev"
    assert run_cli("trust", "add", str(pub), "--store", str(store), env=env).returncode == 0
    trust_env = {**env, "EDGEKIT_TRUST_DIR": str(store / "trust")}
    assert_user_error(run_cli("bench", str(b), "-n", "1", env=trust_env), "refusing unsigned bundle")
    p = run_cli("sign", str(b), "--key", "ci", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["key_id"] == kid
    assert run_cli("bench", str(b), "-n", "1", "--json", env=trust_env).returncode == 0
    assert run_cli("trust", "revoke", kid, "--store", str(store), env=env).returncode == 0
    listed = json.loads(run_cli("trust", "list", "--store", str(store), "--json", env=env).stdout)
    assert listed["revoked"] == [kid] and listed["keys"][0]["revoked"] is True
    assert_user_error(run_cli("bench", str(b), "-n", "1", env=trust_env), "which is revoked")
    assert_user_error(run_cli("trust", "revoke", "xyz", "--store", str(store), env=env), "is not a key id")
    assert_user_error(run_cli("trust", "list", "--store", str(tmp_path / "none"), env=env), "does not exist")


# -- ssh ---------------------------------------------------------------------------------------------


@needs_sshd
def test_signed_bundles_deploy_through_ssh_and_unsigned_are_refused(
    built: Path, tmp_path: Path, keys: Path, sshd: Sshd
) -> None:
    """Checked on this host before anything is sent; manifest.sig travels in the tar and is checksummed."""
    trust = TrustStore(tmp_path / "host-trust")
    trust.add_key((keys / "new.pub").read_bytes(), "new")
    remote = tmp_path / "remote"
    url = sshd.url(remote)
    unsigned = copy(built, tmp_path, "u")
    with pytest.raises(SignatureError, match="refusing unsigned bundle"):
        ship(unsigned, url, trust=trust.root)
    assert not remote.exists()  # refused before connecting
    signed = copy(built, tmp_path, "s")
    sign_bundle(signed, "new", version=5)
    dest = ship(signed, url, trust=trust.root)
    assert dest.endswith(f"{remote}/bundles/{Bundle.open(signed).id}")
    landed = remote / "bundles" / Bundle.open(signed).id
    assert (landed / SIGNATURE).read_bytes() == (signed / SIGNATURE).read_bytes()
    device_trust = TrustStore(remote / "trust")  # the device's own store, as its agent would use it
    device_trust.add_key((keys / "new.pub").read_bytes(), "new")
    assert DeviceStore(remote).bundle().info.version == 5
    assert json.loads((trust.root / "versions.json").read_text())["tiny-x86-cpu"]["version"] == 5
