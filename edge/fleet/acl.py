"""A Mosquitto ACL for one fleet, for a listener that takes the client certificate's CN as the user name.

With ``require_certificate true`` and ``use_identity_as_username true``, ``%u`` in a
``pattern`` line is the CN the fleet CA signed (see ``edge.fleet.pki``), so:

- a device may publish only its own ``birth``/``telemetry``/``state``/``death`` (the will
  included) under ``edgekit/<fleet>/<its id>/``, and read only ``edgekit/<fleet>/<its id>/cmd/#``;
- each collector identity (``collector:<name>``) reads every device's messages of the fleet
  (shared subscriptions included) and may publish commands (``cmd/rebirth``) to any of them.

A fleet tool's own sync marker (``edgekit fleet tune``'s ``cmd/tune-sync``, the rollout controller's
``cmd/rollout-sync``: published to itself, it comes back after the retained messages) goes under the name
the broker knows the tool by (:func:`own_level`): ``edgekit/<fleet>/collector:<name>/cmd/<marker>``. The
``%u/cmd/#`` read pattern lets that identity, and only it, read it; only collector identities may write any
``cmd/`` (devices none), and no device id can be ``collector:<name>`` (``:`` is not in a device id).

Anything else is denied: Mosquitto drops a denied publish (an MQTT 5 client gets "not
authorized" in its PUBACK) and never delivers a message the reader may not read.
One fleet per ACL file: a device certificate is not bound to a fleet, so a broker serving
several fleets would let a device publish as itself in each of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from edge.errors import EdgeError
from edge.fleet.pki import PkiError, Role, identity
from edge.mqtt.topics import INBOUND_KINDS, KINDS, ROOT, check_part

DEFAULT_COLLECTOR = "main"


def mosquitto_acl(fleet: str, *, collectors: Sequence[str] = (DEFAULT_COLLECTOR,)) -> str:
    """The ACL file's text. ``collectors`` are collector names (their identity is ``collector:<name>``)."""
    check_part(fleet, "fleet")
    if "%" in fleet:
        raise PkiError(f"fleet {fleet!r} contains '%', which Mosquitto would read as a pattern substitution")
    if not collectors:
        raise PkiError("name at least one collector: without one, nobody may read the fleet's messages")
    base = f"{ROOT}/{fleet}"
    lines = [
        f"# edgekit fleet {fleet!r}: Mosquitto acl_file for a listener with require_certificate true and",
        "# use_identity_as_username true (written by `edgekit fleet acl`; edit the fleet, not this file).",
        "",
        "# every client: publish only as itself, read only its own commands",
    ]
    lines += [f"pattern write {base}/%u/{kind}" for kind in KINDS if kind != "cmd"]
    lines += [f"pattern read {base}/%u/cmd/#"]
    lines += [f"pattern read {base}/%u/{kind}" for kind in INBOUND_KINDS] + [""]  # its desired state (#14)
    for name in dict.fromkeys(collectors):  # in order, once each
        lines += (
            [f"user {identity(name, Role.COLLECTOR)}", f"topic read {base}/+/+", f"topic write {base}/+/cmd/+"]
            + [f"topic write {base}/+/{kind}" for kind in INBOUND_KINDS]
            + [""]
        )
    return "\n".join(lines)


def own_level(broker: Any, client_id: str) -> str:
    """The topic level for a client's own markers (``edgekit/<fleet>/<level>/cmd/...``): the name the broker knows it
    by, which the ACL's ``%u`` is: ``broker.username``, else its client certificate's CN
    (``use_identity_as_username``), else (a broker without either) the client id."""
    for name in (getattr(broker, "username", None), _cert_cn(getattr(broker, "cert_file", None))):
        if name:
            try:
                return check_part(name, "user name")
            except EdgeError:
                pass
    return client_id[:100]


def _cert_cn(cert_file: Any) -> str | None:
    if cert_file is None:
        return None
    from edge.fleet.pki import certificate_identity

    try:
        return certificate_identity(Path(cert_file).read_bytes())
    except (OSError, EdgeError):  # unreadable here, or no cryptography: the connection itself says what is wrong
        return None


def write_acl(path: str | os.PathLike[str], fleet: str, *, collectors: Sequence[str] = (DEFAULT_COLLECTOR,)) -> Path:
    text = mosquitto_acl(fleet, collectors=collectors)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(p)  # a broker reloading (SIGHUP) never reads half a file
    return p
