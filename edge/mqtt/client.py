"""Broker address, credentials and TLS, and the one place paho-mqtt is imported.

``mqtt://[user@]host[:port]`` (1883) or ``mqtts://[user@]host[:port]`` (8883, TLS). A CA file
implies TLS. Several nodes of one broker cluster: their addresses joined by commas
(``mqtt://a:1883,mqtt://b:1883``), all with the same scheme and user; a client that cannot
connect, or loses its connection, tries the next one (round robin, with its back-off). Passwords never come from the command line (other users see argv): they come
from ``--password-file`` or ``$EDGEKIT_MQTT_PASSWORD``.

Protocol: MQTT 5 by default; ``protocol="3.1.1"`` for brokers that speak only that (NATS, Azure
IoT Hub, older RabbitMQ). What needs MQTT 5 is then degraded, and ``degraded()`` says what:
no shared subscriptions, no session expiry, no receive maximum, no PUBACK reason codes.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from edge.errors import EdgeError, InputFileError, MissingDependencyError

PASSWORD_ENV = "EDGEKIT_MQTT_PASSWORD"
PROTOCOLS = ("5", "3.1.1")
#: what each side loses on an MQTT 3.1.1 broker, said once in a log line
DEGRADED = {
    "collector": "MQTT 3.1.1: no shared subscription (this collector receives every message of the fleet; "
    "several collectors each store everything once, the database drops the copies), no receive "
    "maximum (the broker's own in-flight limit applies), no session expiry (the broker keeps this "
    "session's messages until it drops them by its own rules)",
    "agent": "MQTT 3.1.1: no PUBACK reason codes, so a message no subscriber took (MQTT 5 reason 0x10) cannot be "
    "held in the outbox: start the collector (its persistent session) before the devices",
}
INSTALL_HINT = "pip install 'edgekit-ml[mqtt]'"
MAX_ADDRESSES = 16  # nodes of one cluster in one --broker
#: said once when a broker closes an MQTT 5 CONNECT without any CONNACK over plain TCP
MQTT5_UNANSWERED = (
    "the broker closed the connection before answering an MQTT 5 CONNECT: if it speaks MQTT 3.1.1 "
    "only (RabbitMQ < 3.13, NATS), use --protocol 3.1.1"
)


def paho() -> Any:
    """``paho.mqtt.client``, imported on first use (the agent on a device needs nothing else)."""
    try:
        import paho.mqtt  # noqa: F401
        import paho.mqtt.client as client
    except ImportError:
        raise MissingDependencyError("the MQTT client library paho-mqtt is not installed", hint=INSTALL_HINT) from None
    major = int(str(getattr(paho.mqtt, "__version__", "0")).split(".")[0] or 0)
    if major < 2:
        raise MissingDependencyError(
            f"paho-mqtt {paho.mqtt.__version__} is too old; edgekit needs 2.0 or newer", hint=INSTALL_HINT
        )
    return client


@dataclass(frozen=True)
class BrokerConfig:
    host: str
    port: int
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    keepalive_s: int = 30
    connect_timeout_s: float = 5.0
    protocol: str = "5"  # or "3.1.1"
    #: every node's (host, port) when several were given, the first being (host, port); () for one address
    addresses: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        username: str | None = None,
        password: str | None = None,
        password_file: str | os.PathLike[str] | None = None,
        keepalive_s: int = 30,
        protocol: str = "5",
    ) -> BrokerConfig:
        protocol = check_protocol(protocol)
        parts = [p.strip() for p in str(url).split(",")]
        if len(parts) > MAX_ADDRESSES:
            raise EdgeError(f"{len(parts)} broker addresses: at most {MAX_ADDRESSES} nodes of one cluster")
        parsed = [_parse_address(p) for p in parts]
        scheme, user_in_url = parsed[0][0], parsed[0][1]
        for p, (sch, usr, _, _) in zip(parts[1:], parsed[1:]):
            if sch != scheme:
                raise EdgeError(
                    f"broker address {p[:200]!r} uses {sch}:// and {parts[0][:200]!r} {scheme}://",
                    hint="the nodes of one cluster share one scheme (TLS or not), credentials and CA",
                )
            if usr != user_in_url:
                raise EdgeError(
                    f"broker address {p[:200]!r} names another user than {parts[0][:200]!r}",
                    hint="the nodes of one cluster share one user: give it once with --username",
                )
        tls = scheme == "mqtts" or ca_file is not None or cert_file is not None
        endpoints = [(host, port or (8883 if tls else 1883)) for _, _, host, port in parsed]
        if len(set(endpoints)) != len(endpoints):
            raise EdgeError(f"a broker address is listed twice in {str(url)[:300]!r}")
        if (cert_file is None) != (key_file is None):
            raise EdgeError("a client certificate needs both --cert and --key")
        for what, f in (("CA file", ca_file), ("client certificate", cert_file), ("client key", key_file)):
            if f is not None and not Path(f).is_file():
                raise InputFileError(f"{what} {f} does not exist")
        if password_file is not None:
            pf = Path(password_file)
            if not pf.is_file():
                raise InputFileError(f"password file {pf} does not exist")
            password = pf.read_text(encoding="utf-8").rstrip("\r\n")
        elif password is None:
            password = os.environ.get(PASSWORD_ENV) or None
        user = username or user_in_url
        if password is not None and user is None:
            raise EdgeError("a password was given without a user name", hint="pass --username or mqtt://user@host")
        return cls(
            host=endpoints[0][0],
            port=endpoints[0][1],
            tls=tls,
            ca_file=Path(ca_file) if ca_file else None,
            cert_file=Path(cert_file) if cert_file else None,
            key_file=Path(key_file) if key_file else None,
            username=user,
            password=password,
            keepalive_s=keepalive_s,
            protocol=protocol,
            addresses=tuple(endpoints) if len(endpoints) > 1 else (),
        )

    @property
    def endpoints(self) -> tuple[tuple[str, int], ...]:
        """Every node's (host, port), in the order given; one for a single address."""
        return self.addresses or ((self.host, self.port),)

    def at(self, index: int) -> BrokerConfig:
        """This configuration for one node only (``index`` taken round robin): what a connection attempt uses."""
        if not self.addresses:
            return self
        host, port = self.addresses[index % len(self.addresses)]
        return replace(self, host=host, port=port, addresses=())

    def check_reachable(self) -> None:
        """Open (and close) a TCP connection to the broker: a wrong host or port, or a broker that is not
        running, fails here with the reason. For a process that should not start without its broker;
        the agent does not ask (a device runs and spools while the broker is away)."""
        import socket

        errors = []
        for i in range(len(self.endpoints)):
            node = self.at(i)
            try:
                socket.create_connection((node.host, node.port), timeout=self.connect_timeout_s).close()
                return  # one node of a cluster is enough to start; the others are tried when it goes away
            except OSError as e:
                errors.append(f"{node.url}: {e.strerror or e}" if self.addresses else str(e.strerror or e))
        where = "any node of the MQTT broker" if self.addresses else f"the MQTT broker at {self.url}"
        raise EdgeError(f"cannot reach {where}: {'; '.join(errors)}", hint="is it running, and is the address right?")

    @property
    def url(self) -> str:
        """``scheme://[user@]host:port``; several nodes: their addresses joined by commas (as ``--broker`` takes)."""
        user = f"{self.username}@" if self.username else ""
        scheme = "mqtts" if self.tls else "mqtt"
        return ",".join(f"{scheme}://{user}{_host(h)}:{p}" for h, p in self.endpoints)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx

    @property
    def mqtt5(self) -> bool:
        return self.protocol == "5"

    def new_client(self, client_id: str, *, manual_ack: bool = False, clean_session: bool = True) -> Any:
        """A fresh paho client (MQTT 5 or 3.1.1, callback API v2) with TLS and credentials applied; not connected.
        ``clean_session`` is for MQTT 3.1.1 only (MQTT 5 gives ``clean_start`` to ``connect``)."""
        mqtt = paho()
        if self.mqtt5:
            c = mqtt.Client(
                mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, manual_ack=manual_ack
            )
        else:
            c = mqtt.Client(
                mqtt.CallbackAPIVersion.VERSION2,
                client_id=client_id,
                protocol=mqtt.MQTTv311,
                clean_session=clean_session,
                manual_ack=manual_ack,
            )
        c.connect_timeout = self.connect_timeout_s
        ctx = self.ssl_context()
        if ctx is not None:
            c.tls_set_context(ctx)
        if self.username is not None:
            c.username_pw_set(self.username, self.password)
        return c


def _parse_address(url: str) -> tuple[str, str | None, str, int | None]:
    """One ``mqtt[s]://[user@]host[:port]``: scheme, user (or None), host, port (or None)."""
    u = urlparse(url)
    if u.scheme not in ("mqtt", "mqtts") or not u.hostname:
        raise EdgeError(
            f"bad broker address {url[:200]!r}",
            hint="use mqtt://host[:port] or mqtts://host[:port], several nodes of one cluster joined by commas",
        )
    if u.path not in ("", "/") or u.query or u.fragment:
        raise EdgeError(f"bad broker address {url[:200]!r}: no path or query expected", hint="use mqtt://host[:port]")
    if u.password:
        raise EdgeError(
            "a password in the broker URL would be visible to every user of this machine",
            hint=f"use --password-file or ${PASSWORD_ENV}",
        )
    try:
        port = u.port
    except ValueError:
        raise EdgeError(f"bad port in broker address {url[:200]!r}") from None
    if port == 0:
        raise EdgeError(f"bad port in broker address {url[:200]!r}")
    return u.scheme, unquote(u.username) if u.username else None, u.hostname, port


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it


def check_protocol(protocol: str) -> str:
    p = str(protocol).strip().lower().removeprefix("mqtt").removeprefix("v")
    p = {"311": "3.1.1", "5.0": "5"}.get(p, p)
    if p not in PROTOCOLS:
        raise EdgeError(f"unknown MQTT protocol version {str(protocol)[:40]!r}", hint="use --protocol 5 or 3.1.1")
    return p
