"""edge.video.sources: real files written with OpenCV; every bad input is a clear SourceError."""

from __future__ import annotations

from pathlib import Path

import cv2  # the `video` extra, part of `all` and `dev`: a missing OpenCV fails here, it does not skip
import numpy as np
import pytest

from edge.errors import EdgeError, InputFileError
from edge.video.sources import (
    CameraSource,
    ImageDirSource,
    SyntheticScene,
    VideoFileSource,
    open_source,
    parse_size,
    write_synthetic_clip,
)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", frames=24, width=160, height=120, fps=30)


def test_video_file_frames_timestamps_and_info(clip: Path) -> None:
    with VideoFileSource(clip) as src:
        info = src.info
        frames = list(src)
    assert (info.kind, info.width, info.height, info.fps, info.frame_count, info.live) == (
        "video",
        160,
        120,
        30.0,
        24,
        False,
    )
    assert info.backend and info.codec
    assert len(frames) == 24
    assert all(f.image.shape == (120, 160, 3) and f.image.dtype == np.uint8 for f in frames)
    pts = [f.pts_s for f in frames]
    assert pts[0] == 0.0 and pts[-1] == pytest.approx(23 / 30, abs=1e-3)
    assert all(b > a for a, b in zip(pts, pts[1:]))
    # the decoded picture is the scene that was written (mp4v is lossy: close, not equal)
    scene = SyntheticScene(160, 120, seed=0)
    assert np.abs(frames[5].image.astype(int) - scene.frame(5).astype(int)).mean() < 12


def test_skip_advances_without_decoding_to_bgr(clip: Path) -> None:
    with VideoFileSource(clip) as src:
        assert src.skip() and src.skip()
        f = src.read()
    assert f is not None and f.pts_s == pytest.approx(2 / 30, abs=1e-3)


def test_mjpg_avi_also_reads(tmp_path: Path) -> None:
    p = write_synthetic_clip(tmp_path / "c.avi", frames=5, width=64, height=48, codec="MJPG")
    with open_source(video=p) as src:
        assert src.info.codec == "MJPG" and len(list(src)) == 5


def test_missing_empty_and_non_video_files(tmp_path: Path, clip: Path) -> None:
    with pytest.raises(InputFileError, match="does not exist"):
        VideoFileSource(tmp_path / "nope.mp4")
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(InputFileError, match="is empty"):
        VideoFileSource(tmp_path / "empty.mp4")
    (tmp_path / "notes.mp4").write_text("not a video at all\n" * 20)
    with pytest.raises(InputFileError, match="cannot open .*not a video file"):
        VideoFileSource(tmp_path / "notes.mp4")
    with pytest.raises(InputFileError, match="directory.*--images"):
        VideoFileSource(tmp_path)
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(clip.read_bytes()[:2000])  # header only, no frame data
    with pytest.raises(InputFileError, match="truncated|cannot decode|cannot open"):
        VideoFileSource(truncated)


def test_codec_opencv_cannot_open(tmp_path: Path) -> None:
    """A real AVI whose codec tag names a codec no FFmpeg build has."""
    avi = write_synthetic_clip(tmp_path / "c.avi", frames=3, width=64, height=48, codec="MJPG")
    data = avi.read_bytes().replace(b"MJPG", b"ZZZZ").replace(b"mjpg", b"ZZZZ")
    bad = tmp_path / "unknown-codec.avi"
    bad.write_bytes(data)
    with pytest.raises(InputFileError, match="AVI container, but its codec is not one") as e:
        VideoFileSource(bad)
    assert "re-encode" in str(e.value)


def test_camera_that_does_not_exist() -> None:
    # No camera on this machine (nor on CI): the error path is tested, the capture path cannot be.
    if any(Path("/dev").glob("video*")):
        pytest.skip(
            "hardware: camera present: this host has a /dev/video* device; the missing-camera error is tested on hosts without one"
        )
    with pytest.raises(InputFileError, match="camera 7 does not exist: there is no /dev/video7") as e:
        CameraSource(7)
    assert "cameras on this host: none" in str(e.value)
    with pytest.raises(InputFileError, match=">= 0"):
        CameraSource(-1)


def test_image_directory(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, (h, w) in (("b.png", (30, 40)), ("a.png", (20, 50)), ("c.jpg", (32, 32))):
        cv2.imwrite(str(tmp_path / name), rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    cv2.imwrite(str(tmp_path / "gray.png"), rng.integers(0, 256, (10, 12), dtype=np.uint8))
    (tmp_path / "readme.txt").write_text("ignored")
    with ImageDirSource(tmp_path, fps=10) as src:
        frames = list(src)
        assert src.info.frame_count == 4
    assert [f.name for f in frames] == ["a.png", "b.png", "c.jpg", "gray.png"]
    assert [f.image.shape for f in frames] == [(20, 50, 3), (30, 40, 3), (32, 32, 3), (10, 12, 3)]
    assert [f.pts_s for f in frames] == [0.0, 0.1, 0.2, pytest.approx(0.3)]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputFileError, match="holds no images"):
        ImageDirSource(empty)
    with pytest.raises(InputFileError, match="does not exist"):
        ImageDirSource(tmp_path / "missing")


def test_unreadable_image_fails_when_read(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "0.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "1.png").write_bytes(b"\x89PNG broken")
    with ImageDirSource(tmp_path) as src:
        assert src.read() is not None
        with pytest.raises(InputFileError, match="cannot read image .*1.png"):
            src.read()


def test_synthetic_source_and_open_source_rules() -> None:
    with open_source(synthetic="64x48", frames=5, fps=50) as src:
        frames = list(src)
    assert len(frames) == 5 and frames[0].image.shape == (48, 64, 3) and frames[1].pts_s == 0.02
    assert not np.array_equal(frames[0].image, frames[1].image)  # the scene moves
    assert parse_size("640x480") == (640, 480)
    for bad in ("640", "axb", "8x8"):
        with pytest.raises(EdgeError, match="640x480|at least"):
            parse_size(bad)
    with pytest.raises(EdgeError, match="exactly one source"):
        open_source()
    with pytest.raises(EdgeError, match="exactly one source.*--video, --synthetic"):
        open_source(video="x.mp4", synthetic="64x48")


def test_without_opencv_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from edge.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "cv2", None)  # as if opencv-python-headless were not installed
    (tmp_path / "x.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    with pytest.raises(MissingDependencyError, match=r"pip install 'edgekit-ml\[video\]'"):
        open_source(video=tmp_path / "x.mp4")
    with pytest.raises(MissingDependencyError, match="OpenCV"):
        open_source(synthetic="64x48")
