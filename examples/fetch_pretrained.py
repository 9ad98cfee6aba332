#!/usr/bin/env python3
"""Extract a small *pretrained* ONNX classifier from a pinned PyPI wheel.

The model is PaddleOCR's text-direction classifier (``ch_ppocr_mobile_v2.0_cls``: is a
text-line crop upright, "0", or upside down, "180"?) as converted to ONNX and shipped in
the ``rapidocr`` 3.10.0 wheel under Apache-2.0. Nothing is installed: the wheel is only
opened as a zip file.

    python examples/fetch_pretrained.py                      # runs `pip download` into a temp dir
    python examples/fetch_pretrained.py --wheel-dir ~/wheels # use an already downloaded wheel

Without ``--wheel-dir`` the script runs ``pip download --no-deps rapidocr==3.10.0``
(about 27 MB), which is the one explicit network step; edgekit itself never downloads
models. The member's SHA-256 is checked against the value pinned below before anything
is written. See examples/models/README.md for the model's input spec and pre-processing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# --- pinned provenance --------------------------------------------------------------
WHEEL_PROJECT = "rapidocr"
WHEEL_VERSION = "3.10.0"
WHEEL_FILENAME = "rapidocr-3.10.0-py3-none-any.whl"
WHEEL_SHA256 = "2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050"
MEMBER = "rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx"
MEMBER_SIZE = 585_532
MEMBER_SHA256 = "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
OUTPUT_NAME = "ch_ppocr_mobile_v2.0_cls_mobile.onnx"
LICENSE = "Apache-2.0 (weights: Baidu / PaddleOCR authors; ONNX conversion: RapidOCR authors)"
LICENSE_MEMBERS = (
    "rapidocr-3.10.0.dist-info/licenses/LICENSE",
    "rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md",
)
# -------------------------------------------------------------------------------------

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "models"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download_wheel(dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(dest), f"{WHEEL_PROJECT}=={WHEEL_VERSION}",
    ]
    print("running:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return dest / WHEEL_FILENAME


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def extract(wheel: Path, out_dir: Path, *, licenses: bool = True) -> Path:
    """Verify and extract the pinned model (and licence texts) from ``wheel``."""
    if not wheel.is_file():
        raise SystemExit(f"error: {wheel} not found (expected the wheel {WHEEL_FILENAME})")
    wheel_sha = _sha256(wheel.read_bytes())
    print(f"wheel:   {wheel}  sha256 {wheel_sha}")
    if wheel_sha != WHEEL_SHA256:
        print(f"note:    wheel sha256 differs from the pinned {WHEEL_SHA256};"
              " relying on the member check below")
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(MEMBER)
        except KeyError:
            raise SystemExit(f"error: {MEMBER} is not in {wheel.name}") from None
        member_sha = _sha256(data)
        if member_sha != MEMBER_SHA256 or len(data) != MEMBER_SIZE:
            raise SystemExit(
                f"error: {MEMBER} has sha256 {member_sha} ({len(data)} bytes); pinned "
                f"{MEMBER_SHA256} ({MEMBER_SIZE} bytes). Nothing written."
            )
        target = out_dir / OUTPUT_NAME
        _write_atomic(target, data)
        print(f"wrote:   {target}  ({len(data):,} bytes, sha256 {member_sha} verified)")
        if licenses:
            lic_dir = out_dir / "licenses" / f"{WHEEL_PROJECT}-{WHEEL_VERSION}"
            for name in LICENSE_MEMBERS:
                _write_atomic(lic_dir / Path(name).name, zf.read(name))
            print(f"wrote:   licence texts to {lic_dir}")
    print(f"licence: {LICENSE}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheel-dir", type=Path,
        help=f"directory holding {WHEEL_FILENAME}; default: `pip download` it into a temp dir",
    )
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help="where to write the model (default: %(default)s)")
    parser.add_argument("--no-licenses", action="store_true",
                        help="do not copy the wheel's licence texts next to the model")
    args = parser.parse_args(argv)
    if args.wheel_dir is not None:
        extract(args.wheel_dir / WHEEL_FILENAME, args.out_dir, licenses=not args.no_licenses)
        return 0
    with tempfile.TemporaryDirectory(prefix="edgekit-wheel-") as tmp:
        wheel = _download_wheel(Path(tmp))
        extract(wheel, args.out_dir, licenses=not args.no_licenses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
