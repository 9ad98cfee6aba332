"""Natural photographs shipped with edgekit: calibration and parity data when the user gives none.

Nine small photographs from scikit-image's bundled data, each public domain or CC0 (``natural_images/index.json`` names
the source, the licence and the sha256 of every file). Six are for calibration, three for parity (two of them
with people, so a person/face detector finds something and its detection metric is judged), each also used
mirrored left to right. The two sets are disjoint by file, so an int8 bundle is never graded on what it was
calibrated on, and every configuration the budget search tries is graded on the same inputs.

Only an image input with pre-processing gets them: audio and token-id inputs keep the generated inputs of
``edge.verify.inputs`` (no openly licensed speech recording ships in a package edgekit keeps, and token ids are
the model's own vocabulary's, which no shipped text could match).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edge.errors import EdgeError

DIR = Path(__file__).with_name("natural_images")
INDEX = DIR / "index.json"
#: the Calibration.kind and parity provenance kind of these images
KIND: Literal["natural"] = "natural"
Split = Literal["calibration", "parity"]


@dataclass(frozen=True)
class NaturalImage:
    file: str
    split: str
    sha256: str
    licence: str
    what: str
    source: str

    @property
    def path(self) -> Path:
        return DIR / self.file


@functools.lru_cache(maxsize=1)
def images() -> tuple[NaturalImage, ...]:
    """Every shipped image, read from the index (a file whose bytes differ from the pinned sha256 is refused)."""
    try:
        index = json.loads(INDEX.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EdgeError(
            f"edgekit's natural images index {INDEX} cannot be read ({e})", hint="reinstall edgekit"
        ) from None
    out = tuple(
        NaturalImage(i["file"], i["split"], i["sha256"], i["licence"], i["what"], i["source"]) for i in index["images"]
    )
    bad = [i.file for i in out if not i.path.is_file() or hashlib.sha256(i.path.read_bytes()).hexdigest() != i.sha256]
    if bad:
        raise EdgeError(f"edgekit's natural images {', '.join(bad)} are missing or changed", hint="reinstall edgekit")
    return out


def of_split(split: Split) -> tuple[NaturalImage, ...]:
    return tuple(i for i in images() if i.split == split)


def source_line(split: Split) -> str:
    """What the manifest records as the data's source: which images, and their licences."""
    chosen = of_split(split)
    licences = sorted({i.licence.split(" (")[0] for i in chosen})
    return (
        f"edgekit's natural {split} images ({', '.join(i.file for i in chosen)}; each also mirrored; "
        f"{' / '.join(licences)}; from scikit-image's bundled data)"
    )


def record(split: Split) -> list[dict[str, Any]]:
    """Per image: file, sha256, licence and source (the manifest's calibration record)."""
    return [{"file": i.file, "sha256": i.sha256, "licence": i.licence, "source": i.source} for i in of_split(split)]


def frames(split: Split) -> list[np.ndarray]:
    """The split's images as HxWx3 uint8 RGB, each followed by its mirror image."""
    from edge.preprocess import read_image

    out: list[np.ndarray] = []
    for i in of_split(split):
        rgb = read_image(i.path)
        out += [rgb, np.ascontiguousarray(rgb[:, ::-1])]
    return out


def available() -> str | None:
    """Why the images cannot be read here (None: they can): reading them needs Pillow."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        return "reading edgekit's natural images needs Pillow (pip install 'edgekit-ml[convert]')"
    return None
