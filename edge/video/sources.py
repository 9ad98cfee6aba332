"""Where frames come from: a video file, a camera, a directory of images, or a synthetic scene.

Every source yields HxWx3 uint8 **BGR** frames (OpenCV's order; the pre-processor swaps to
the model's order in the same pass that normalises) with a timestamp in seconds of media
time. OpenCV decodes: measured on this project's 2-core host at 640x480 it read mp4v at
~2,500 fps and H.264 at ~1,800 fps into BGR arrays where PyAV managed ~1,450-2,100 and
~1,450 (OpenCV's pip wheels cannot *encode* H.264; decoding it is fine). OpenCV is imported
inside the sources, so the rest of edgekit works without it.
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from edge.errors import EdgeError, MissingDependencyError, ModelError
from edge.native_stderr import captured_stderr
from edge.preprocess import IMAGE_SUFFIXES
from edge.video.errors import SourceError, UnreadableFrame
from edge.video.frames import AgentFrame, paced

VIDEO_EXTRA = "pip install 'edgekit-ml[video]'"


def cv2_module() -> Any:
    """OpenCV, or a clear error naming the extra that brings it."""
    try:
        import cv2
    except ImportError:
        raise MissingDependencyError("video sources need OpenCV (opencv-python-headless)", hint=VIDEO_EXTRA) from None
    return cv2


@dataclass(frozen=True)
class Frame:
    image: np.ndarray  # HxWx3 uint8 BGR
    pts_s: float | None  # media time in seconds (None: the source has none)
    name: str | None = None  # file name, for image directories


@dataclass(frozen=True)
class SourceInfo:
    kind: str  # "video", "camera", "images", "synthetic"
    name: str
    width: int | None
    height: int | None
    fps: float | None  # nominal rate: the container's, the camera's, or the one asked for
    frame_count: int | None  # None when unknown (cameras) or only estimated badly
    live: bool  # frames arrive on their own clock (a camera): the pipeline cannot pause the source
    codec: str | None = None
    backend: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FrameSource(ABC):
    """Owns an open source; ``read`` returns the next frame or None at the end."""

    info: SourceInfo

    @abstractmethod
    def read(self) -> Frame | None: ...

    def skip(self) -> bool:
        """Advance one frame without handing it out (cheaper where the backend allows); False at the end."""
        return self.read() is not None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the device or file."""

    def __enter__(self) -> FrameSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Frame]:
        """Every readable frame (unreadable ones are skipped; the runners count them)."""
        while True:
            try:
                f = self.read()
            except UnreadableFrame:
                continue
            if f is None:
                return
            yield f


def _fourcc(cap: Any, cv2: Any) -> str | None:
    code = int(cap.get(cv2.CAP_PROP_FOURCC))
    text = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4))
    return text.strip("\x00 ") if code and text.isprintable() else None


def _quote_native(lines: list[str]) -> str:
    """Native messages for an error line: printable characters only, short."""
    text = "; ".join("".join(c for c in line if c.isprintable() and c != "\ufffd") for line in lines)
    return f" ({text[:200]})" if text else ""


def _container(path: Path) -> str | None:
    """What the first bytes say the file is (for error messages)."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head[4:8] == b"ftyp":
        return "an MP4/MOV container"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "an AVI container"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "a Matroska/WebM container"
    if head[:3] == b"FLV" or head[:4] == b"OggS" or head[:1] == b"\x47":
        return "a video container"
    return None


class VideoFileSource(FrameSource):
    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if not p.exists():
            raise SourceError(f"video file {p} does not exist")
        if not p.is_file():
            raise SourceError(
                f"{p} is not a video file (it is a directory)" if p.is_dir() else f"{p} is not a file",
                hint="pass a directory of images with --images" if p.is_dir() else None,
            )
        try:
            with p.open("rb") as f:
                empty = not f.read(1)
        except OSError as e:
            raise SourceError(f"cannot read video file {p}: {e.strerror}") from None
        if empty:
            raise SourceError(f"video file {p} is empty")
        cv2 = cv2_module()
        self._cv2 = cv2
        container = _container(p)
        with captured_stderr() as native:  # OpenCV/FFmpeg complain on fd 2; an error quotes it
            self._cap = cap = cv2.VideoCapture(str(p))
            opened = cap.isOpened()
            codec = _fourcc(cap, cv2) if opened else None
            ok, first = cap.read() if opened else (False, None)
        if not opened:
            cap.release()
            if container:
                raise SourceError(
                    f"OpenCV {cv2.__version__} cannot decode {p}: it is {container}, but its codec "
                    "is not one this OpenCV build's FFmpeg can open, or the file is truncated or corrupt"
                    + _quote_native(native),
                    hint="re-encode it, e.g. `ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p OUT.mp4`",
                )
            raise SourceError(
                f"OpenCV {cv2.__version__} cannot open {p}: not a video file it can read" + _quote_native(native),
                hint="give an .mp4/.avi/.mkv file, or a directory of images with --images",
            )
        if not ok or first is None:
            cap.release()
            raise SourceError(
                f"OpenCV opened {p} ({container or 'unknown container'}, codec {codec or '?'}) "
                "but cannot decode a frame from it" + _quote_native(native),
                hint="the file may be truncated or use a codec this OpenCV build lacks; re-encode it",
            )
        if native:
            sys.stderr.write("\n".join(native) + "\n")
        self._pending: np.ndarray | None = first
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self._fps = fps if fps > 0 and np.isfinite(fps) else None
        self._index = 0
        self.info = SourceInfo(
            "video",
            str(p),
            first.shape[1],
            first.shape[0],
            self._fps,
            count if count > 0 else None,
            live=False,
            codec=codec,
            backend=cap.getBackendName(),
        )

    def _pts(self) -> float | None:
        ms = float(self._cap.get(self._cv2.CAP_PROP_POS_MSEC))
        if ms > 0 or self._index == 0:
            return ms / 1000.0
        return self._index / self._fps if self._fps else None

    def read(self) -> Frame | None:
        if self._pending is not None:
            image, self._pending = self._pending, None
        else:
            ok, image = self._cap.read()
            if not ok:
                return None
        frame = Frame(image, self._pts())
        self._index += 1
        return frame

    def skip(self) -> bool:
        if self._pending is not None:
            self._pending = None
            self._index += 1
            return True
        ok = bool(self._cap.grab())  # demux and decode, but no conversion to BGR
        self._index += ok
        return ok

    def close(self) -> None:
        self._cap.release()


class CameraSource(FrameSource):
    """A V4L2/AVFoundation/DirectShow camera by index, through OpenCV. Live: the camera sets the pace."""

    def __init__(self, index: int) -> None:
        if index < 0:
            raise SourceError(f"camera index must be >= 0, got {index}")
        if sys.platform.startswith("linux"):
            dev = Path(f"/dev/video{index}")
            if not dev.exists():
                present = sorted(str(d) for d in Path("/dev").glob("video*"))
                raise SourceError(
                    f"camera {index} does not exist: there is no {dev}",
                    hint=f"cameras on this host: {', '.join(present) if present else 'none'}; "
                    "use --video FILE or --synthetic WxH to run without one",
                )
        cv2 = cv2_module()
        self._cap = cap = cv2.VideoCapture(index)
        if not cap.isOpened():
            cap.release()
            raise SourceError(
                f"camera {index} exists but OpenCV cannot open it",
                hint="is another program using it, and may this user read it (group 'video')?",
            )
        ok, first = cap.read()
        if not ok or first is None:
            cap.release()
            raise SourceError(f"camera {index} opened but delivered no frame")
        self._pending: np.ndarray | None = first
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self._t0 = time.perf_counter()
        self.info = SourceInfo(
            "camera",
            f"camera {index}",
            first.shape[1],
            first.shape[0],
            fps if fps > 0 and np.isfinite(fps) else None,
            None,
            live=True,
            codec=_fourcc(cap, cv2),
            backend=cap.getBackendName(),
        )

    def read(self) -> Frame | None:
        if self._pending is not None:
            image, self._pending = self._pending, None
        else:
            ok, image = self._cap.read()
            if not ok:
                return None
        return Frame(image, time.perf_counter() - self._t0)

    def close(self) -> None:
        self._cap.release()


class ImageDirSource(FrameSource):
    """The images in a directory, in name order, as frames (at ``fps`` media time when given).

    A file that does not decode is one lost frame, not the end of the source: ``read`` raises
    :class:`UnreadableFrame` for it and the next ``read`` goes on with the file after (the
    runners count it as dropped, reason ``unreadable``). Only a directory where no image at
    all decodes is refused when opened.
    """

    def __init__(self, directory: str | Path, fps: float | None = None) -> None:
        d = Path(directory)
        if not d.is_dir():
            raise SourceError(f"image directory {d} does not exist" if not d.exists() else f"{d} is not a directory")
        self._files = sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not self._files:
            raise SourceError(f"image directory {d} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        self._cv2 = cv2_module()
        self._index = 0
        self._pending: tuple[int, np.ndarray] | None = None  # the image decoded here, and its index
        first = None
        for k, path in enumerate(self._files):  # the first image that decodes gives the frame size
            first = self._cv2.imread(str(path), self._cv2.IMREAD_COLOR)
            if first is not None:
                self._pending = (k, first)
                break
        if first is None:
            raise SourceError(
                f"none of the {len(self._files)} images in {d} can be decoded (first: {self._files[0].name})",
                hint="are they images, and complete?",
            )
        self.info = SourceInfo("images", str(d), first.shape[1], first.shape[0], fps, len(self._files), live=False)

    def read(self) -> Frame | None:
        if self._index >= len(self._files):
            return None
        index, path = self._index, self._files[self._index]
        self._index += 1
        if self._pending is not None and self._pending[0] == index:
            image: np.ndarray | None = self._pending[1]
            self._pending = None
        else:
            image = self._cv2.imread(str(path), self._cv2.IMREAD_COLOR)
        if image is None:
            raise UnreadableFrame(index, path.name, f"cannot read image {path}: not an image OpenCV can decode")
        fps = self.info.fps
        return Frame(image, index / fps if fps else None, path.name)

    def skip(self) -> bool:
        if self._index >= len(self._files):
            return False
        if self._pending is not None and self._pending[0] == self._index:
            self._pending = None
        self._index += 1
        return True


class SyntheticScene:
    """A deterministic moving scene: a textured background panning under coloured shapes."""

    def __init__(self, width: int = 640, height: int = 480, seed: int = 0) -> None:
        if width < 16 or height < 16:
            raise EdgeError(f"synthetic frames must be at least 16x16, got {width}x{height}")
        cv2 = cv2_module()
        self._cv2 = cv2
        self.width, self.height = width, height
        rng = np.random.default_rng(seed)
        coarse = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), dtype=np.uint8)
        smooth = cv2.resize(coarse, (width * 2, height * 2), interpolation=cv2.INTER_CUBIC)
        grain = rng.integers(-12, 13, smooth.shape, dtype=np.int16)
        self._background = np.clip(smooth.astype(np.int16) + grain, 0, 255).astype(np.uint8)
        self._shapes = [
            (
                rng.uniform(0.1, 0.9, 2),
                rng.uniform(-0.01, 0.01, 2),
                rng.uniform(0.05, 0.2),
                tuple(int(c) for c in rng.integers(0, 256, 3)),
                bool(rng.integers(0, 2)),
            )
            for _ in range(5)
        ]

    def frame(self, index: int) -> np.ndarray:
        cv2, w, h = self._cv2, self.width, self.height
        ox = int((index * 2) % w)
        oy = int((index * 1) % h)
        img = np.ascontiguousarray(self._background[oy : oy + h, ox : ox + w])
        for start, velocity, size, colour, round_ in self._shapes:
            cx, cy = np.abs(((start + velocity * index) % 2.0) - 1.0) * np.array([w, h])  # bounce
            r = int(size * min(w, h))
            if round_:
                cv2.circle(img, (int(cx), int(cy)), r, colour, -1)
            else:
                cv2.rectangle(img, (int(cx) - r, int(cy) - r // 2), (int(cx) + r, int(cy) + r // 2), colour, -1)
        return img


class SyntheticSource(FrameSource):
    """``count`` frames of a :class:`SyntheticScene` (for benchmarks: no decoding cost beyond a copy)."""

    def __init__(
        self,
        width: int = 640,
        height: int = 480,
        *,
        count: int | None = 300,
        fps: float | None = None,
        seed: int = 0,
        distinct: int = 32,
    ) -> None:
        scene = SyntheticScene(width, height, seed)
        # a ring of pre-rendered frames: the "decode" stage costs one copy, like a camera's buffer
        self._ring = [scene.frame(i) for i in range(max(1, min(distinct, count or distinct)))]
        self._count = count
        self._index = 0
        self.info = SourceInfo("synthetic", f"synthetic {width}x{height}", width, height, fps, count, live=False)

    def read(self) -> Frame | None:
        if self._count is not None and self._index >= self._count:
            return None
        image = self._ring[self._index % len(self._ring)].copy()
        fps = self.info.fps
        frame = Frame(image, self._index / fps if fps else None)
        self._index += 1
        return frame

    def skip(self) -> bool:
        if self._count is not None and self._index >= self._count:
            return False
        self._index += 1
        return True


def write_synthetic_clip(
    path: str | Path,
    *,
    frames: int = 120,
    width: int = 640,
    height: int = 480,
    fps: float = 60.0,
    codec: str = "mp4v",
    seed: int = 0,
) -> Path:
    """Write a :class:`SyntheticScene` clip with OpenCV (``mp4v`` in .mp4, ``MJPG`` in .avi, ...)."""
    cv2 = cv2_module()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*codec), float(fps), (width, height))
    if not writer.isOpened():
        raise MissingDependencyError(
            f"OpenCV {cv2.__version__} cannot write {codec!r} video to {out.name}",
            hint="use codec 'mp4v' (.mp4) or 'MJPG' (.avi); OpenCV's wheels cannot encode H.264",
        )
    scene = SyntheticScene(width, height, seed)
    try:
        for i in range(frames):
            writer.write(scene.frame(i))
    finally:
        writer.release()
    return out


def parse_size(text: str) -> tuple[int, int]:
    """``"640x480"`` -> (640, 480)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise EdgeError(f"size must look like 640x480, got {text!r}") from None
    if w < 16 or h < 16:
        raise EdgeError(f"size must be at least 16x16, got {text!r}")
    return w, h


def open_source(
    *,
    video: str | Path | None = None,
    camera: int | None = None,
    images: str | Path | None = None,
    synthetic: str | tuple[int, int] | None = None,
    frames: int | None = None,
    fps: float | None = None,
) -> FrameSource:
    """Exactly one of ``video``, ``camera``, ``images`` or ``synthetic`` (``"640x480"``).

    ``fps`` is the media rate for sources without one of their own (images, synthetic);
    ``frames`` is how many synthetic frames to make (default 300).
    """
    given = [
        n
        for n, v in (("--video", video), ("--camera", camera), ("--images", images), ("--synthetic", synthetic))
        if v is not None
    ]
    if len(given) != 1:
        raise EdgeError(
            "give exactly one source: --video FILE, --camera N, --images DIR or --synthetic WxH"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if video is not None:
        return VideoFileSource(video)
    if camera is not None:
        return CameraSource(camera)
    if images is not None:
        return ImageDirSource(images, fps=fps)
    w, h = parse_size(synthetic) if isinstance(synthetic, str) else synthetic  # type: ignore[misc]
    return SyntheticSource(w, h, count=frames if frames is not None else 300, fps=fps)


class AgentVideoSource:
    """The device agent's workload from a video file, a camera or an image directory (``edge.agent.sources``).

    Each frame is read, pre-processed by the bundle's ``Preprocessor`` (as ``edgekit run`` does) and
    handed to the agent as ``(feeds, started_ns, finish)``: ``started_ns`` is taken before the read and
    ``finish`` runs the post-processor ``edgekit run`` picks for the bundle, so the latency the agent
    reports is the application's, decode to post-processed result. Files and image directories start
    over at their end (the agent runs until stopped); frames are paced at ``fps`` (a camera paces itself).
    """

    def __init__(self, kind: str, arg: str, *, bundle: Any, fps: float | None) -> None:
        from edge.preprocess import Preprocessor
        from edge.video.postprocess import make_postprocessor

        spec, inputs = bundle.preprocess, bundle.io.inputs
        if spec is None or len(inputs) != 1:
            raise ModelError(
                f"bundle {bundle.id} has no single image input to feed {kind} frames to",
                hint="use --source synthetic, or a bundle converted with a --preprocess preset",
            )
        self.kind, self.arg = kind, arg
        self.pre = Preprocessor(spec, src_color="BGR")
        self.input_name = spec.input
        self.post = make_postprocessor(bundle.io)
        self._source = self._open()
        self.fps = fps or self._source.info.fps or 30.0
        self.description = f"{kind} {arg} at {self.fps:g} fps" if kind != "camera" else f"camera {arg}"
        self.dropped = 0
        self.unreadable = 0
        self.restarts = 0
        self._buf = self.pre.new_output()

    def _open(self) -> FrameSource:
        if self.kind == "video":
            return VideoFileSource(self.arg)
        if self.kind == "camera":
            return CameraSource(int(self.arg))
        return ImageDirSource(self.arg)

    def _read(self) -> Frame | None:
        for _ in range(2):
            try:
                frame = self._source.read()
            except UnreadableFrame:
                self.unreadable += 1
                self.dropped += 1
                return None
            if frame is not None or self._source.info.live:
                return frame
            self._source.close()  # the end of a file: start over
            self._source = self._open()
            self.restarts += 1
        raise SourceError(f"{self.kind} source {self.arg} yields no frames")

    def frames(self, stop: Any) -> Iterator[Any]:
        ticks = paced(self.fps, stop, self) if not self._source.info.live else iter(int, 1)
        for _ in ticks:
            if stop.is_set():
                return
            t0 = time.perf_counter_ns()
            frame = self._read()
            if frame is None:
                continue
            x, tf = self.pre(frame.image, out=self._buf)
            hw = (int(frame.image.shape[0]), int(frame.image.shape[1]))

            def finish(outputs: Mapping[str, Any], tf: Any = tf, hw: tuple[int, int] = hw) -> Any:
                return self.post(outputs, tf, hw)  # this frame's transform and size, bound now

            yield AgentFrame({self.input_name: x}, t0, finish)

    def close(self) -> None:
        self._source.close()


def open_agent_source(
    kind: str, arg: str, *, bundle: Any, runner: Any = None, fps: float | None = None
) -> AgentVideoSource:
    """The agent's ``video:FILE`` / ``camera:N`` / ``images:DIR`` source (contract: ``edge.agent.sources``)."""
    if kind not in ("video", "camera", "images"):
        raise EdgeError(f"unknown agent source kind {kind!r}", hint="use video:FILE, camera:N or images:DIR")
    return AgentVideoSource(kind, arg, bundle=bundle, fps=fps)
