"""``edgekit keys generate|list|export`` and ``edgekit sign BUNDLE --key NAME``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import typer
from rich.table import Table

from edge.cli._common import JsonOut, command, console, print_json
from edge.errors import SignatureError

app = typer.Typer(
    help="Signing keys (Ed25519) for bundles: generate, list, export the public key.", no_args_is_help=True
)

KeysDir = typer.Option(
    None, "--dir", help="Keys directory (default: $EDGEKIT_KEYS_DIR, else ~/.config/edgekit/keys).", show_default=False
)
SignKey = typer.Option(
    None,
    "--sign-key",
    help="Sign the bundle with this key (a name in the keys directory, or a PEM path); default: $EDGEKIT_SIGN_KEY when set.",
    show_default=False,
)


def sign_if_configured(bundle: Any, key: str | None, say: Callable[[str], None]) -> Any:
    """``bundle`` signed with ``key`` (else $EDGEKIT_SIGN_KEY) and reopened; as it is when neither names a key."""
    from edge.bundle.bundle import Bundle, sign_bundle
    from edge.bundle.signing import configured_sign_key

    k = configured_sign_key(key)
    if k is None:
        return bundle
    say(f"signing {bundle.id} with {k}")
    sign_bundle(bundle.path, k)
    return Bundle.open(bundle.path, trust=False)


@app.command("generate")
@command
def generate_cmd(
    name: str = typer.Argument(..., help="Key name (A-Z a-z 0-9 . _ -)."),
    directory: Path | None = KeysDir,
    as_json: bool = JsonOut,
) -> None:
    """Make an Ed25519 key: NAME.pem (private, mode 0600) and NAME.pub (give this to devices)."""
    from edge.bundle.signing import generate_key

    k = generate_key(name, directory)
    if as_json:
        print_json(k.to_json())
    else:
        console.print(f"key {k.name} ({k.key_id}): private {k.private_path}, public {k.public_path}", highlight=False)


@app.command("list")
@command
def list_cmd(directory: Path | None = KeysDir, as_json: bool = JsonOut) -> None:
    """The keys in the keys directory, with their key ids."""
    from edge.bundle.signing import keys_dir, list_keys

    keys = list_keys(directory)
    if as_json:
        print_json([k.to_json() for k in keys])
        return
    t = Table(title=f"signing keys in {keys_dir(directory)}")
    for col in ("name", "key id", "private key"):
        t.add_column(col)
    for k in keys:
        t.add_row(k.name, k.key_id, str(k.private_path) if k.private_path.exists() else "(public only)")
    console.print(t)


@app.command("export")
@command
def export_cmd(
    name: str = typer.Argument(..., help="Key name."),
    directory: Path | None = KeysDir,
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the public key here (default: stdout).", show_default=False
    ),
) -> None:
    """Print NAME's public key (PEM), for `edgekit trust add` on devices."""
    from edge.bundle.signing import export_public_key

    pem = export_public_key(name, directory)
    if output is None:
        typer.echo(pem, nl=False)
    else:
        output.write_text(pem, encoding="ascii")


def sign_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    key: str | None = typer.Option(
        None,
        "--key",
        "-k",
        help="Key name in the keys directory, or a PEM path (default: $EDGEKIT_SIGN_KEY).",
        show_default=False,
    ),
    version: int | None = typer.Option(
        None,
        "--version",
        help="The bundle's version (default: seconds since the epoch, above the last this signer gave its name).",
        show_default=False,
    ),
    directory: Path | None = KeysDir,
    as_json: bool = JsonOut,
) -> None:
    """Sign BUNDLE: set its name and version in the manifest, write manifest.sig over the canonical manifest."""
    from edge.bundle.bundle import sign_bundle
    from edge.bundle.signing import configured_sign_key

    k = configured_sign_key(key)
    if k is None:
        raise SignatureError("no key to sign with", hint="pass --key NAME, or set $EDGEKIT_SIGN_KEY")
    r = sign_bundle(bundle, k, version=version, directory=directory)
    if as_json:
        print_json(r.to_json())
    else:
        console.print(
            f"signed {r.bundle_id} with key {r.key_id}: {r.name} version {r.version} → {r.signature_path}",
            highlight=False,
        )
