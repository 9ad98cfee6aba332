from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge.calib import generated_samples, load_calibration
from edge.errors import CalibrationError
from edge.preprocess import Preprocessor
from edge.spec import IOSpec, PreprocessSpec, TensorSpec, default_preprocess

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
    spec = PreprocessSpec(input="x", size=(2, 2), layout="NCHW", color="BGR", scale=1.0, mean=(1.0, 2.0, 3.0),
                          std=(1.0, 1.0, 2.0), preset="raw")
    frame = np.zeros((2, 2, 3), np.uint8)
    frame[..., 0] = 10  # R in an RGB frame
    frame[..., 2] = 30  # B
    x, _ = Preprocessor(spec, src_color="RGB")(frame)
    assert x.shape == (1, 3, 2, 2)
    # BGR order: channel 0 is the source's B
    assert np.allclose(x[0, 0], (30 - 1) / 1) and np.allclose(x[0, 1], -2.0) and np.allclose(x[0, 2], (10 - 3) / 2)


def test_letterbox_pads_and_reports_the_transform() -> None:
    spec = PreprocessSpec(input="x", size=(32, 32), resize="letterbox", preset="yolo", mean=(0, 0, 0), std=(1, 1, 1), scale=1.0)
    x, tf = Preprocessor(spec)(np.full((16, 32, 3), 200, np.uint8))
    assert tf.scale == 1.0 and (tf.pad_x, tf.pad_y) == (0, 8)
    assert np.allclose(x[0, :, :8, :], 114) and np.allclose(x[0, :, 8:24, :], 200)


def test_generated_samples_cover_non_image_inputs() -> None:
    s = generated_samples(IO2, default_preprocess(IO2), 2)
    assert s[0]["scale"].shape == (1, 4) and s[0]["image"].shape == (1, 3, 16, 16)
