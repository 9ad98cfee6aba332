"""Device stores: where shipped bundles live on a device, switched atomically, crash-safe and locked.

One ``Store`` interface (``install``, ``current``, ``previous``, ``rollback``, ``history``, ``close``)
with a local implementation (``DeviceStore``) and an ssh one (``SshStore``) that keep the same
layout, protocol and guarantees — see ``edge.store.base`` for the on-disk order and why it is safe.
"""

from __future__ import annotations

import os
from typing import Any

from edge.errors import DeployError
from edge.store.base import (
    BUNDLES,
    CURRENT,
    DEFAULT_LOCK_TIMEOUT_S,
    HISTORY,
    INSTALL_STEPS,
    PREVIOUS,
    SWITCH_STEPS,
    StepHook,
    Store,
    StoreState,
    check_bundle_id,
)
from edge.store.local import DeviceStore, symlink_atomic
from edge.store.ssh import SSH_OPTIONS_ENV, SshStore, parse_ssh_options, parse_ssh_url

__all__ = [
    "BUNDLES",
    "CURRENT",
    "HISTORY",
    "INSTALL_STEPS",
    "PREVIOUS",
    "SSH_OPTIONS_ENV",
    "SWITCH_STEPS",
    "DeviceStore",
    "SshStore",
    "Store",
    "StoreState",
    "check_bundle_id",
    "open_store",
    "parse_ssh_options",
    "parse_ssh_url",
    "rollback",
    "symlink_atomic",
]


def open_store(
    device: str | os.PathLike[str],
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
    on_step: StepHook | None = None,
    trust: Any = None,
) -> Store:
    """A local directory, or ``ssh://[user@]host[:port]/path`` (extra ``-o Key=Value`` ssh options from
    $EDGEKIT_SSH_OPTIONS). A bad address fails here, before anything is built or sent.

    ``trust``: the trust store that must vouch for what is installed (``edge.bundle.trust.resolve_trust``:
    default ``$EDGEKIT_TRUST_DIR``, else a local store's own ``trust/``; False: none)."""
    d = os.fspath(device)
    if isinstance(d, bytes):
        d = os.fsdecode(d)
    if d.startswith("ssh://"):
        options = parse_ssh_options(os.environ.get(SSH_OPTIONS_ENV, ""))
        if on_step is not None:
            raise DeployError("step hooks run only for local stores (an ssh store's steps run on the device)")
        return SshStore(d, options=options, lock_timeout=lock_timeout, trust=trust)
    if "://" in d:
        raise DeployError(f"unsupported device address {d!r}", hint="use a local directory or ssh://user@host/path")
    return DeviceStore(d, lock_timeout=lock_timeout, on_step=on_step, trust=trust)


def rollback(device: str | os.PathLike[str]) -> str:
    """Make the previous bundle current again; returns its id."""
    with open_store(device) as store:
        return store.rollback()
