"""``edgekit trust add|revoke|list|target``: a device's trust store (``edge.bundle.trust``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from edge.bundle.signing import read_key_file
from edge.bundle.trust import TrustStore
from edge.cli._common import JsonOut, command, console, print_json
from edge.errors import SignatureError

app = typer.Typer(help="A device's trust store: the keys its bundles must be signed with.", no_args_is_help=True)

StoreDir = typer.Option(None, "--store", help="Device store: its trust store is <store>/trust.", show_default=False)
TrustDir = typer.Option(
    None, "--trust-dir", help="The trust store directory itself (default: $EDGEKIT_TRUST_DIR).", show_default=False
)


def _trust(store: Path | None, trust_dir: Path | None, *, create: bool) -> TrustStore:
    import os

    from edge.bundle.trust import STORE_TRUST, TRUST_DIR_ENV

    if store is not None and trust_dir is not None:
        raise SignatureError("give --store or --trust-dir, not both")
    root = trust_dir or (store / STORE_TRUST if store is not None else None)
    if root is None and os.environ.get(TRUST_DIR_ENV):
        root = Path(os.environ[TRUST_DIR_ENV])
    if root is None:
        raise SignatureError("which trust store?", hint=f"pass --store DIR or --trust-dir DIR, or set ${TRUST_DIR_ENV}")
    if not create and not root.is_dir():
        raise SignatureError(f"trust store {root} does not exist", hint="create it with `edgekit trust add KEY.pub`")
    return TrustStore(root)


@app.command("add")
@command
def add_cmd(
    key: Path = typer.Argument(..., help="Public key (PEM, from `edgekit keys export`)."),
    store: Path | None = StoreDir,
    trust_dir: Path | None = TrustDir,
    expires: str | None = typer.Option(
        None,
        "--expires",
        help="Refuse this key's signatures after this time (ISO 8601, e.g. 2027-01-01T00:00:00+00:00).",
        show_default=False,
    ),
    as_json: bool = JsonOut,
) -> None:
    """Trust KEY for this device's bundles (several keys may be trusted at once: rotation)."""
    pem = read_key_file(key, "public key")
    ts = _trust(store, trust_dir, create=True)
    k = ts.add_key(pem, str(key), not_after=expires)
    if as_json:
        print_json(k.to_json())
    else:
        console.print(
            f"trusted key {k.key_id} in {ts.root}" + (f" until {k.not_after.isoformat()}" if k.not_after else ""),
            highlight=False,
        )


@app.command("revoke")
@command
def revoke_cmd(
    key_id: str = typer.Argument(..., help="Key id (16 hex digits, see `edgekit trust list`)."),
    store: Path | None = StoreDir,
    trust_dir: Path | None = TrustDir,
) -> None:
    """Refuse every bundle signed by KEY_ID from now on (even if its public key stays in keys/)."""
    ts = _trust(store, trust_dir, create=True)
    ts.revoke(key_id)
    console.print(f"revoked key {key_id} in {ts.root}", highlight=False)


@app.command("target")
@command
def target_cmd(
    targets: list[str] = typer.Argument(..., help="Target profile name(s) this device runs."),
    store: Path | None = StoreDir,
    trust_dir: Path | None = TrustDir,
) -> None:
    """Admit only bundles built for these targets (the device's target class)."""
    ts = _trust(store, trust_dir, create=True)
    ts.set_targets(list(targets))
    console.print(f"{ts.root} admits bundles for: {', '.join(targets)}", highlight=False)


@app.command("list")
@command
def list_cmd(store: Path | None = StoreDir, trust_dir: Path | None = TrustDir, as_json: bool = JsonOut) -> None:
    """Trusted keys (revoked and expired marked), the target class, and the highest version seen per name."""
    ts = _trust(store, trust_dir, create=False)
    keys = ts.keys()
    revoked = ts.revoked()
    targets, versions = ts.targets(), ts.versions()
    data = {
        "trust_dir": str(ts.root),
        "keys": [k.to_json() for k in keys.values()],
        "revoked": sorted(revoked),
        "targets": targets,
        "versions": versions,
    }
    if as_json:
        print_json(data)
        return
    t = Table(title=f"trust store {ts.root}")
    for col in ("key id", "state", "not after"):
        t.add_column(col)
    for k in keys.values():
        state = "revoked" if k.revoked else ("expired" if k.expired() else "trusted")
        t.add_row(k.key_id, state, k.not_after.isoformat() if k.not_after else "-")
    for kid in sorted(revoked - set(keys)):
        t.add_row(kid, "revoked", "-")
    console.print(t)
    console.print(f"targets: {', '.join(targets) if targets else 'any'}", highlight=False)
    for name, v in sorted(versions.items()):
        if isinstance(v, dict):
            console.print(f"{name}: version {v.get('version')} ({v.get('bundle_id')})", highlight=False)
