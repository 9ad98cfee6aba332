"""The generated ACL (edge.fleet.acl) and the fleet tools' own sync markers, against a real Mosquitto with an mTLS
listener, the fleet CA's client certificates, their CN as the user name and the ACL ``edgekit fleet acl`` writes.

``edgekit fleet tune`` (DeviceLink) and the rollout controller (FleetView) each publish a marker to themselves and
wait for it to come back after the retained messages; under the ACL the marker must be readable by the collector
identity that sent it, by no device, and writable by no device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography", reason="cryptography is not installed (pip install 'edgekit-ml[fleet]')")

from edge.fleet.acl import own_level, write_acl  # noqa: E402
from edge.fleet.rollout_view import FleetView  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop  # noqa: E402
from edge.mqtt.outbox import MemoryOutbox  # noqa: E402
from edge.mqtt.session import DeviceSession, SessionOptions  # noqa: E402
from edge.tune.remote import DeviceLink  # noqa: E402
from tests.support.cli import wait_for  # noqa: E402
from tests.support.mqtt_broker import make_fleet_pki, mosquitto_binary, mtls_broker  # noqa: E402

FAST = Backoff(0.05, 0.5)
NOT_AUTHORIZED = 0x87  # MQTT 5 PUBACK reason code


def _cfg(creds: Any, url: str) -> BrokerConfig:
    return BrokerConfig.from_url(url, ca_file=creds.ca_cert, cert_file=creds.cert, key_file=creds.key)


def test_own_level_is_the_name_the_broker_knows(tmp_path: Path) -> None:
    pki = make_fleet_pki(tmp_path / "pki", devices=("cam-a",), collectors=("main",))
    url = "mqtts://127.0.0.1:8883"
    assert own_level(_cfg(pki.clients["collector:main"], url), "edgekit-tune-1") == "collector:main"
    assert own_level(_cfg(pki.clients["cam-a"], url), "x") == "cam-a"
    assert own_level(BrokerConfig.from_url("mqtt://h", username="ops"), "x") == "ops"
    assert own_level(BrokerConfig.from_url("mqtt://h"), "edgekit-tune-1") == "edgekit-tune-1"  # no identity: the id
    # a user name that cannot be a topic level, or a certificate that cannot be read: the client id
    assert own_level(BrokerConfig.from_url("mqtt://h", username="a/b"), "cid") == "cid"
    bad = tmp_path / "bad.crt"
    bad.write_text("not a certificate")
    assert own_level(BrokerConfig(host="h", port=1, tls=True, cert_file=bad), "cid") == "cid"


def test_the_collector_syncs_on_its_own_marker_and_no_device_writes_or_reads_it(tmp_path: Path) -> None:
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    pki = make_fleet_pki(tmp_path / "pki", devices=("cam-a",), collectors=("main",))
    col, dev = pki.clients["collector:main"], pki.clients["cam-a"]
    acl = write_acl(tmp_path / "acl.conf", "lab", collectors=["main"])
    marker = "edgekit/lab/collector:main/cmd/tune-sync"
    with mtls_broker(tmp_path / "broker", pki, acl) as broker, NetworkLoop(name="edgekit-test") as loop:
        device = DeviceSession(
            loop,
            _cfg(dev, broker.url),
            "lab",
            "cam-a",
            MemoryOutbox(),
            options=SessionOptions(backoff=FAST),
            birth_body=lambda: {"state": "idle", "host": {"os": "linux", "arch": "x86_64"}},
        )
        acks: dict[int, int] = {}
        seen: list[tuple[str, bytes]] = []  # what a device certificate receives of the collector's markers
        forger = Connection(
            loop,
            _cfg(dev, broker.url),
            "cam-a-forger",
            options=ConnectOptions(backoff=FAST),
            subscriptions=[("edgekit/lab/collector:main/cmd/#", 1), ("edgekit/lab/cam-a/cmd/#", 1)],
            on_message=lambda _c, m: seen.append((m.topic, bytes(m.payload))),
            on_published=lambda _c, mid, rc: acks.__setitem__(mid, rc),
        )
        try:
            loop.run(device.start)
            loop.run(forger.start)
            wait_for(lambda: device.connected and forger.connected, 20, "the device and its forger connected")
            # edgekit fleet tune, with the collector's certificate: synced, and the device's retained birth read
            with DeviceLink(_cfg(col, broker.url), "lab", "cam-a") as link:
                assert link._sync == marker
                wait_for(
                    lambda: link.synced.is_set() and link.birth is not None,
                    20,
                    f"the tune link's sync marker ({link.conn.last_error})",
                )
                assert link.online()
                # a device certificate can neither write the collector's marker (refused: PUBACK not authorized,
                # and never delivered) ...
                mid = loop.run(forger.publish, marker, link._token.encode(), 1)
                wait_for(lambda: mid in acks, 20, "the broker's answer to the forged marker")
                assert acks[mid] == NOT_AUTHORIZED, acks
                link.synced.clear()
                loop.run(link.conn.publish, marker, link._token.encode(), 1)  # after the forged one: delivered
                wait_for(link.synced.is_set, 20, "the collector's own marker again")
            # the rollout controller's view: the same rule
            with FleetView(_cfg(col, broker.url), "lab") as view:
                assert view._sync_topic == "edgekit/lab/collector:main/cmd/rollout-sync"
                assert view.wait_synced(20), view.conn.last_error
                assert "cam-a" in view.snapshot()
                # a command to the device, sent after every marker: the device's certificate reads its own
                view.loop.run(view.conn.publish, "edgekit/lab/cam-a/cmd/probe", b"after the markers", 1)
                wait_for(lambda: seen, 20, "the device's own command")
            # ... nor read it: of the collector's markers (three of them), none reached the device's subscription
            assert seen == [("edgekit/lab/cam-a/cmd/probe", b"after the markers")], seen
        finally:
            device.close(timeout=2)
            loop.run(forger.close)
            forger.closed.wait(2)
