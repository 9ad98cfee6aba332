from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge.errors import CalibrationError
from edge.preprocess import Preprocessor
from edge.spec import IOSpec, PreprocessSpec, TensorSpec, default_preprocess
from edge.verify.inputs import generated_samples, load_calibration

IO = IOSpec((TensorSpec("input", (1, 3, 32, 32), "float32", "NCHW"),), (TensorSpec("logits", (1, 10), "float32"),))
IO2 = IOSpec((TensorSpec("image", (1, 3, 16, 16), "float32", "NCHW"), TensorSpec("scale", (1, 4), "float32")), ())
PRE = default_preprocess(IO)


def test_random_is_deterministic_and_labelled() -> None:
    a = load_calibration("random", IO, PRE, random_count=4)
    b = load_calibration("random", IO, PRE, random_count=4)
    assert a.kind == "random" and a.count == 4 and a.provenance() == {"source": "random", "kind": "random", "count": 4}
    for x, y in zip(a.samples, b.samples):
        np.testing.assert_array_equal(x["input"], y["input"])
    assert a.samples[0]["input"].shape == (1, 3, 32, 32) and a.samples[0]["input"].dtype == np.float32


def test_npy_single_stacked_and_unbatched(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    np.save(tmp_path / "b.npy", rng.standard_normal((3, 32, 32)).astype(np.float32))
    np.save(tmp_path / "c.npy", rng.standard_normal((5, 3, 32, 32)).astype(np.float32))
    c = load_calibration(tmp_path, IO, PRE)
    assert c.kind == "tensors" and c.count == 7
    assert all(s["input"].shape == (1, 3, 32, 32) for s in c.samples)


def test_npz_multi_input(tmp_path: Path) -> None:
    np.savez(tmp_path / "s0.npz", image=np.zeros((1, 3, 16, 16), np.float32), scale=np.ones((1, 4), np.float32))
    c = load_calibration(tmp_path, IO2, None)
    assert c.count == 1 and set(c.samples[0]) == {"image", "scale"}
    np.savez(tmp_path / "s1.npz", image=np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(CalibrationError, match=r"s1.npz.*missing \['scale'\]"):
        load_calibration(tmp_path, IO2, None)


def test_every_bad_file_is_reported(tmp_path: Path) -> None:
    np.save(tmp_path / "shape.npy", np.zeros((1, 3, 64, 64), np.float32))
    np.save(tmp_path / "dtype.npy", np.zeros((1, 3, 32, 32), np.float64))
    with pytest.raises(CalibrationError) as e:
        load_calibration(tmp_path, IO, PRE)
    msg = str(e.value)
    assert "shape.npy: input 'input' shape [1, 3, 64, 64], expected [1, 3, 32, 32]" in msg
    assert "dtype.npy: input 'input' dtype float64, expected float32" in msg


def test_empty_and_missing_directories(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="holds no .npy, .npz or image files"):
        load_calibration(tmp_path, IO, PRE)
    with pytest.raises(CalibrationError, match="does not exist"):
        load_calibration(tmp_path / "nope", IO, PRE)


def test_images_go_through_the_preprocessing(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    Image.fromarray(img).save(tmp_path / "frame.png")
    c = load_calibration(tmp_path, IO, PRE)
    assert c.kind == "images" and c.count == 1
    np.testing.assert_allclose(c.samples[0]["input"], Preprocessor(PRE)(img)[0])
    with pytest.raises(CalibrationError, match="no image input"):
        load_calibration(tmp_path, IOSpec((TensorSpec("x", (1, 4), "float32"),), ()), None)


def test_preprocessor_normalises_and_lays_out() -> None:
    spec = PreprocessSpec(
        input="x",
        size=(2, 2),
        layout="NCHW",
        color="BGR",
        scale=1.0,
        mean=(1.0, 2.0, 3.0),
        std=(1.0, 1.0, 2.0),
        preset="raw",
    )
    frame = np.zeros((2, 2, 3), np.uint8)
    frame[..., 0] = 10  # R in an RGB frame
    frame[..., 2] = 30  # B
    x, _ = Preprocessor(spec, src_color="RGB")(frame)
    assert x.shape == (1, 3, 2, 2)
    # BGR order: channel 0 is the source's B
    assert np.allclose(x[0, 0], (30 - 1) / 1) and np.allclose(x[0, 1], -2.0) and np.allclose(x[0, 2], (10 - 3) / 2)


def test_letterbox_pads_and_reports_the_transform() -> None:
    spec = PreprocessSpec(
        input="x", size=(32, 32), resize="letterbox", preset="yolo", mean=(0, 0, 0), std=(1, 1, 1), scale=1.0
    )
    x, tf = Preprocessor(spec)(np.full((16, 32, 3), 200, np.uint8))
    assert tf.scale == 1.0 and (tf.pad_x, tf.pad_y) == (0, 8)
    assert np.allclose(x[0, :, :8, :], 114) and np.allclose(x[0, :, 8:24, :], 200)


def test_generated_samples_cover_non_image_inputs() -> None:
    s = generated_samples(IO2, default_preprocess(IO2), 2)
    assert s[0]["scale"].shape == (1, 4) and s[0]["image"].shape == (1, 3, 16, 16)


# -- parity inputs that look like the model's data (issue 13) -----------------------------------------


def test_generated_frames_have_natural_image_statistics() -> None:
    from edge.verify.inputs import natural_frames

    frames = list(natural_frames(4, 96, 96, seed=0))
    assert all(f.shape == (96, 96, 3) and f.dtype == np.uint8 for f in frames)
    f = frames[0].astype(np.float64).mean(axis=2)
    # neighbouring pixels are correlated (uniform noise: ~0) and the spectrum falls with frequency
    corr = np.corrcoef(f[:, :-1].ravel(), f[:, 1:].ravel())[0, 1]
    power = np.abs(np.fft.rfft2(f - f.mean())) ** 2
    assert corr > 0.6 and power[1:4, 1:4].mean() > 50 * power[30:45, 30:45].mean()
    lines = list(natural_frames(2, 48, 320, seed=0))  # a recognizer's text line: dark glyphs on light paper
    dark = (lines[0].mean(axis=2) < 90).mean()
    assert lines[0].mean() > 150 and 0.02 < dark < 0.5


def test_sample_rate_state_mask_and_audio_inputs_get_plausible_values() -> None:
    io = IOSpec(
        (
            TensorSpec("input", (1, 512), "float32"),
            TensorSpec("state", (2, 1, 128), "float32"),
            TensorSpec("sr", (), "int64"),
        ),
        (),
    )
    s = generated_samples(io, None, 2, seed=3)
    assert int(s[0]["sr"]) == 16000 and s[0]["sr"].shape == () and not s[0]["state"].any()
    audio = s[0]["input"]
    assert audio.shape == (1, 512) and 0.05 < np.abs(audio).max() <= 0.5 and not np.allclose(audio, s[1]["input"])
    ids = IOSpec(
        (
            TensorSpec("input_ids", (1, 16), "int64"),
            TensorSpec("attention_mask", (1, 16), "int64"),
            TensorSpec("position_ids", (1, 16), "int64"),
        ),
        (),
    )
    t = generated_samples(ids, None, 1)[0]
    assert (t["attention_mask"] == 1).all() and t["position_ids"].tolist() == [list(range(16))]
    assert 1 <= t["input_ids"].min() and t["input_ids"].max() < 1000


def _wav(path: Path, seconds: float, rate: int) -> None:
    import wave

    x = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(seconds * rate)) / rate) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(x.tobytes())


def test_parity_data_from_wav_and_token_text(tmp_path: Path) -> None:
    from edge.verify.inputs import read_samples

    io = IOSpec((TensorSpec("input", (1, 512), "float32"), TensorSpec("sr", (), "int64")), ())
    _wav(tmp_path / "a.wav", 0.2, 8000)  # resampled to 16 kHz: 3200 samples -> 6 windows of 512
    samples, kind = read_samples(tmp_path, io, None, what="parity data")
    assert kind == "audio" and len(samples) == 6 and int(samples[0]["sr"]) == 16000
    assert np.abs(samples[0]["input"]).max() == pytest.approx(0.3, abs=0.01)
    text = tmp_path / "ids.txt"
    text.write_text("5 6 7\n\n1, 2, 3, 4\n")
    ids = IOSpec((TensorSpec("input_ids", (1, 4), "int64"),), ())
    got, kind = read_samples(text, ids, None, what="parity data")
    assert kind == "text" and [g["input_ids"].tolist() for g in got] == [[[5, 6, 7, 0]], [[1, 2, 3, 4]]]
    text.write_text("five six\n")
    with pytest.raises(CalibrationError, match="ids.txt:1: not whitespace-separated token ids"):
        read_samples(text, ids, None, what="parity data")


def test_int8_parity_samples_are_held_out_of_calibration(tmp_path: Path) -> None:
    from edge.verify.inputs import choose_parity_inputs

    rng = np.random.default_rng(0)
    for i in range(12):
        np.save(tmp_path / f"s{i:02d}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    cal = load_calibration(tmp_path, IO, PRE)
    chosen = choose_parity_inputs(IO, PRE, count=8, calibration=cal, quantized=True)
    assert chosen.calibration is not None and chosen.calibration.count == 8  # 4 held out (a quarter, at least 4)
    held = {s["input"].tobytes() for s in chosen.samples}
    assert not held & {s["input"].tobytes() for s in chosen.calibration.samples}
    p = chosen.provenance
    assert p["kind"] == "calibration-held-out" and p["disjoint_from_calibration"] is True and p["count"] == 4
    assert "held out" in p["note"] and p["generated_count"] == 0  # the user's data is not topped up
    # fp32: the user's data is used as it is, nothing taken from calibration
    plain = choose_parity_inputs(IO, PRE, count=8, calibration=cal, quantized=False)
    assert plain.provenance["kind"] == "calibration" and plain.calibration is cal and len(plain.samples) == 8
    # --parity-data that repeats calibration samples: they leave calibration, not the parity set
    other = tmp_path / "parity"
    other.mkdir()
    np.save(other / "dup.npy", cal.samples[0]["input"])
    dup = choose_parity_inputs(IO, PRE, count=1, parity_data=other, calibration=cal, quantized=True)
    assert (
        dup.provenance["kind"] == "parity-data" and dup.calibration.count == 11 and "dropped" in dup.provenance["note"]
    )
    # generated calibration (--calib random): parity runs on edgekit's natural parity images, topped up with
    # generated inputs (from another seed than the calibration's)
    rand = load_calibration("random", IO, PRE, random_count=4)
    gen = choose_parity_inputs(IO, PRE, count=8, calibration=rand, quantized=True)
    p = gen.provenance
    assert p["kind"] == "natural" and gen.calibration.count == 4 and p["disjoint_from_calibration"]
    assert p["count"] == 8 and p["generated_count"] == 2 and "astronaut.jpg" in p["source"]  # 3 photos, mirrored
    assert "natural-image" in p["generated"]["input"] and gen.label == "natural images (6) + 2 generated"


def test_natural_images_are_the_default_data(models: dict[str, Path], tmp_path: Path) -> None:
    """No --calib: int8 calibrates on edgekit's shipped natural photographs (their files, hashes and licences in the
    manifest), and parity runs on its natural parity photographs, which no calibration sample equals (issue #30)."""
    import hashlib
    import json

    from edge.pipeline import ConvertRequest, convert
    from edge.verify import natural
    from edge.verify.inputs import choose_parity_inputs, default_calibration

    shipped = natural.images()
    assert {i.split for i in shipped} == {"calibration", "parity"}
    assert all(i.licence.startswith(("CC0", "public domain")) for i in shipped)
    for i in shipped:
        assert hashlib.sha256(i.path.read_bytes()).hexdigest() == i.sha256
    cal, why = default_calibration(IO, PRE)
    assert why is None and cal is not None and cal.kind == "natural" and cal.count == 12  # 6 photos, mirrored
    assert [f["file"] for f in cal.provenance()["files"]] == [i.file for i in natural.of_split("calibration")]
    chosen = choose_parity_inputs(IO, PRE, count=6, calibration=cal, quantized=True)
    assert chosen.provenance["kind"] == "natural" and chosen.calibration.count == 12
    assert not {s["input"].tobytes() for s in chosen.samples} & {s["input"].tobytes() for s in cal.samples}
    # a second float input the photographs cannot feed: no default, the reason said
    assert default_calibration(IO2, default_preprocess(IO2))[0] is None

    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(precision="int8"))
    m = json.loads((b.path / "manifest.json").read_text())
    assert m["precision"] == "int8" and m["calibration"]["kind"] == "natural"
    assert {f["sha256"] for f in m["calibration"]["files"]} == {i.sha256 for i in natural.of_split("calibration")}
    assert m["parity"]["input_provenance"]["kind"] == "natural" and m["parity"]["passed"]
    assert m["parity"]["input_provenance"]["disjoint_from_calibration"] is True


YOLOV8N = Path(__file__).resolve().parents[2] / "examples" / "models" / "nudenet_320n.onnx"


@pytest.mark.corpus_full  # YOLOv8n is an optional model CI does not fetch (examples/fetch_pretrained.py)
@pytest.mark.skipif(not YOLOV8N.is_file(), reason="YOLOv8n (examples/fetch_pretrained.py --model yolov8n-320) absent")
def test_a_detector_is_judged_on_the_natural_images(tmp_path: Path) -> None:
    """YOLOv8n finds objects (faces) in the natural parity photographs: the detection metric is judged."""
    import json

    from edge.pipeline import ConvertRequest, convert

    b = convert(YOLOV8N, "x86-cpu", tmp_path / "b", ConvertRequest(input_shapes={"images": (1, 3, 320, 320)}))
    out = json.loads((b.path / "manifest.json").read_text())["parity"]["outputs"][0]
    assert out["task"] == "detector" and not out["task_degenerate"]
    assert out["precision"] == 1.0 and out["recall"] == 1.0
