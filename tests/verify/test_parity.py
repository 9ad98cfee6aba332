from __future__ import annotations

import numpy as np
import pytest

from edge.verify.parity import THRESHOLDS, compare, degenerate_reason, output_failures, thresholds_for

RNG = np.random.default_rng(0)
REF = [
    {"logits": RNG.standard_normal((1, 10)).astype(np.float32), "boxes": RNG.standard_normal((1, 5, 4))}
    for _ in range(8)
]


def test_identical_outputs_pass_with_full_agreement() -> None:
    res = compare(REF, REF, THRESHOLDS["fp32"])
    assert all(r.passed for r in res)
    logits, boxes = res
    assert logits.top1 == 1.0 and logits.max_abs == 0.0 and logits.cosine > 0.999999
    assert boxes.top1 is None  # not classifier-shaped


def test_every_kind_of_failure_is_named() -> None:
    cand = [{"logits": -r["logits"], "boxes": np.full((1, 5, 4), np.nan)} for r in REF]
    logits, boxes = compare(REF, cand, THRESHOLDS["int8"])
    assert any("cosine" in f for f in logits.failures) and any("top-1" in f for f in logits.failures)
    assert any("NaN" in f for f in boxes.failures)
    res = compare(REF, [{"logits": r["logits"][:, :5]} for r in REF], THRESHOLDS["fp32"])
    assert "differs" in res[0].failures[0] and "missing" in res[1].failures[0]


def test_a_shape_difference_names_both_shapes() -> None:
    """A 0-d score that came back [1] (Core ML has no 0-d arrays) was reported "shape [] differs from the source's []":
    the message dropped each shape's first axis as if it were the batch."""
    [o] = compare([{"s": np.float32(0.5)}], [{"s": np.array([0.5], np.float32)}], THRESHOLDS["fp32"])
    assert not o.passed and o.failures == ["shape [1] differs from the source's []"], o.failures


def test_one_bad_sample_fails_and_is_reported() -> None:
    cand = [dict(r) for r in REF]
    cand[3] = {"logits": RNG.standard_normal((1, 10)).astype(np.float32), "boxes": REF[3]["boxes"]}
    logits, boxes = compare(REF, cand, THRESHOLDS["fp16"])
    assert not logits.passed and logits.cosine_min < 0.5 and logits.cosine_min < logits.cosine < 0.999
    assert "worst sample" in logits.failures[0] and boxes.passed


def test_thresholds_loosen_to_the_compute_precision_only() -> None:
    assert thresholds_for("fp16", "f16") == THRESHOLDS["fp16"]
    assert thresholds_for("fp16", "bf16").min_cosine == THRESHOLDS["bf16"].min_cosine
    assert thresholds_for("fp32", "f32") == THRESHOLDS["fp32"]
    assert thresholds_for("int8", "bf16") == THRESHOLDS["int8"]  # never stricter than the bundle's own
    assert thresholds_for("int8", "int8 (QDQ)") == THRESHOLDS["int8"]


# -- metrics that hold on real outputs (issue 13) ---------------------------------------------------


def test_snr_and_range_normalised_error_are_reported() -> None:
    ref = [{"y": np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64)} for _ in range(4)]
    cand = [{"y": r["y"] * 1.02} for r in ref]  # 2 % gain error: err^2 / ref^2 = 4e-4 -> 34 dB
    [o] = compare(ref, cand, THRESHOLDS["fp16"], task="none")
    assert o.snr_db == pytest.approx(33.98, abs=0.01) and o.rel_max_abs == pytest.approx(0.02, rel=1e-3)
    assert o.passed and o.ref_min == 0.0 and o.ref_max == pytest.approx(1.0) and not o.degenerate
    [o32] = compare(ref, cand, THRESHOLDS["fp32"], task="none")
    assert o32.cosine > 0.999999  # cosine is blind to a gain error; SNR is not
    assert [f for f in o32.failures if "SNR" in f or "range" in f] == o32.failures and len(o32.failures) == 2


def test_a_degenerate_reference_is_said_and_gated_on_absolute_error() -> None:
    # a DBNet map on uniform noise: ~1e-6 everywhere, rounding noise of 1e-7 -> cosine ~0.99, SNR ~20 dB
    rng = np.random.default_rng(1)
    ref = [{"map": (1e-6 * (1 + 0.1 * rng.random((1, 1, 32, 32)))).astype(np.float32)} for _ in range(4)]
    cand = [{"map": r["map"] + (1e-7 * rng.standard_normal(r["map"].shape)).astype(np.float32)} for r in ref]
    [o] = compare(ref, cand, THRESHOLDS["fp32"])
    assert o.degenerate and o.passed
    assert (o.degenerate_note or "").startswith("not discriminating: the reference output is constant across 4 samples")
    assert o.cosine < THRESHOLDS["fp32"].min_cosine  # what would have failed a correct conversion
    assert o.task == "prob-map" and o.task_degenerate and o.iou is None
    broken = [{"map": r["map"] + np.float32(0.5)} for r in ref]  # degenerate, but the converted model is not
    [b] = compare(ref, broken, THRESHOLDS["fp32"])
    assert not b.passed and "degenerate reference" in b.failures[0]


def test_cosine_counts_only_samples_whose_reference_carries_energy() -> None:
    big = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 8, 8)
    ref = [{"y": big}, {"y": big * 1e-9}]  # the second sample is ~0: its cosine is rounding
    cand = [{"y": big}, {"y": -big * 1e-9}]
    [o] = compare(ref, cand, THRESHOLDS["fp32"], task="none")
    assert o.cosine_samples == 1 and o.cosine == pytest.approx(1.0) and o.passed


def test_tiny_outputs_get_one_pooled_cosine() -> None:
    # a VAD's [1, 1] probability: one value has cosine +/-1 with anything of its sign
    ref = [{"p": np.array([[v]], np.float32)} for v in (0.1, 0.9, 0.5, 0.7)]
    cand = [{"p": np.array([[v]], np.float32)} for v in (0.9, 0.1, 0.5, 0.7)]
    [o] = compare(ref, cand, THRESHOLDS["fp16"])
    assert o.cosine_samples == 0 and o.cosine < 0.8 and not o.passed


def test_a_localised_breakage_fails_the_task_figure() -> None:
    # fp16 overflow saturating a patch of a probability map: most pixels agree, the thresholded map does not
    rng = np.random.default_rng(2)
    ref = [{"map": (rng.random((1, 1, 64, 64)) * 0.25).astype(np.float32)} for _ in range(4)]
    for r in ref:
        r["map"][0, 0, 8:24, 8:40] = 0.9
    cand = [{"map": r["map"].copy()} for r in ref]
    for c in cand:
        c["map"][0, 0, 40:56, 8:40] = 1.0
    [o] = compare(ref, cand, THRESHOLDS["fp16"])
    assert o.task == "prob-map" and o.iou == pytest.approx(0.5)
    assert any("IoU" in f for f in o.failures)


def test_task_none_and_a_task_that_does_not_fit() -> None:
    [logits, boxes] = compare(REF, REF, THRESHOLDS["fp32"], task="none")
    assert logits.task is None and logits.top1 == 1.0  # a classifier keeps its top-1 gate whatever the task
    [_, boxes] = compare(REF, REF, THRESHOLDS["fp32"], task="detector")
    assert boxes.task is None and "does not fit" in (boxes.task_note or "")


def test_the_manifest_gate_judges_the_recorded_figures_the_same_way() -> None:
    # edge.bundle.manifest.parity_verdict calls output_failures on the typed record: the same figures, the same verdict
    from types import SimpleNamespace

    good = dict(
        max_abs=1e-5,
        mean_abs=1e-6,
        cosine=0.999999,
        cosine_min=0.99999,
        top1=None,
        snr_db=60.0,
        rel_max_abs=1e-5,
        ref_min=0.0,
        ref_max=1.0,
        task="prob-map",
        task_degenerate=False,
        iou=0.999,
        top5=None,
        precision=None,
        recall=None,
        tokens=None,
    )
    assert output_failures(SimpleNamespace(**good), THRESHOLDS["fp32"]) == []
    # a record claiming its reference was degenerate must carry a range that is: here it is not, so cosine,
    # SNR and the task figure are judged
    edited = SimpleNamespace(**{**good, "cosine": 0.5, "snr_db": 3.0, "iou": 0.2})
    fails = output_failures(edited, THRESHOLDS["fp32"])
    assert any("cosine" in f for f in fails) and any("SNR" in f for f in fails) and any("IoU" in f for f in fails)
    assert degenerate_reason(0.0, 1e-4) and degenerate_reason(3.0, 3.0) and degenerate_reason(0.0, 1.0) is None


# -- real pretrained models (tests/support/corpus.py; skipped with the fetch command when missing, CI fetches) ------


def _corpus_io(name: str):
    from edge.spec import IOSpec, TensorSpec, default_preprocess
    from tests.support.corpus import CORPUS, corpus_model

    path = corpus_model(name)
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (the reference runtime)")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    m = CORPUS[name]
    types = {"tensor(float)": "float32", "tensor(int64)": "int64"}
    inputs = tuple(
        TensorSpec(i.name, tuple(m.input_shapes.get(i.name, i.shape)), types[i.type]) for i in sess.get_inputs()
    )
    io = IOSpec(inputs, ())
    pre = None if m.preprocess == "none" else default_preprocess(io, m.preprocess, letterbox=m.letterbox)
    return sess, io, pre


def _reference(sess, samples):
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, s))) for s in samples]


def test_ppocr_det_map_is_not_degenerate_on_generated_inputs() -> None:
    from edge.verify.inputs import generated_samples

    sess, io, pre = _corpus_io("ppocr-det")
    samples = generated_samples(io, pre, 4, seed=1234)
    ref = _reference(sess, samples)
    [o] = compare(ref, ref, THRESHOLDS["fp32"])
    # the text in the generated frames lights the map up: a DBNet on uniform noise gave ~1e-6 everywhere
    assert o.task == "prob-map" and not o.degenerate and not o.task_degenerate and o.ref_max > 0.9
    marked = np.mean([(r[o.name] >= 0.3).mean() for r in ref])
    assert 0.005 < marked < 0.6, marked
    noise = [{"x": np.random.default_rng(i).uniform(-1, 1, (1, 3, 320, 320)).astype(np.float32)} for i in range(2)]
    on_noise = _reference(sess, noise)
    assert max(float((r[o.name] >= 0.3).mean()) for r in on_noise) < marked / 5  # what parity used to measure


def test_ppocr_det_openvino_fp32_passes_the_fp32_gate() -> None:
    from edge.verify.inputs import generated_samples

    sess, io, pre = _corpus_io("ppocr-det")
    pytest.importorskip("openvino", reason="needs openvino (the intel-igpu runtime)")
    from edge.backends.openvino.format import ov_core

    samples = generated_samples(io, pre, 4, seed=1234)
    ref = _reference(sess, samples)
    core = ov_core()  # one Core a process (edge.backends.openvino.format)
    model = core.read_model(str(sess._model_path))
    model.reshape({"x": [1, 3, 320, 320]})
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    cand = [{sess.get_outputs()[0].name: compiled(s)[0]} for s in samples]
    [o] = compare(ref, cand, THRESHOLDS["fp32"])
    assert o.passed, o.failures
    assert o.snr_db > 60 and o.iou > 0.999


def test_ppocr_rec_reads_text_lines_and_is_judged_as_ctc() -> None:
    from edge.verify.inputs import generated_samples

    sess, io, pre = _corpus_io("ppocr-rec")
    samples = generated_samples(io, pre, 3, seed=1234)
    ref = _reference(sess, samples)
    [o] = compare(ref, ref, THRESHOLDS["fp32"])
    assert o.task == "sequence" and "CTC" in (o.task_note or "") and o.tokens == 1.0 and not o.task_degenerate
    from edge.verify.tasks import ctc_greedy

    assert all(len(ctc_greedy(r[o.name])) >= 5 for r in ref)  # it reads characters off the generated lines


def test_yolox_detector_finds_things_in_generated_frames() -> None:
    from edge.verify.inputs import generated_samples

    sess, io, pre = _corpus_io("ddddocr-det")
    samples = generated_samples(io, pre, 4, seed=1234)
    ref = _reference(sess, samples)
    [o] = compare(ref, ref, THRESHOLDS["fp32"])
    assert o.task == "detector" and "raw head" in (o.task_note or "") and not o.task_degenerate
    assert o.precision == 1.0 and o.recall == 1.0
    # a converted model whose boxes drift by a cell loses its detections: the task figure says so
    drift = [{o.name: r[o.name] + np.array([1.0, 1.0, 0, 0, 0, 0], np.float32)} for r in ref]
    [d] = compare(ref, drift, THRESHOLDS["int8"])
    assert d.recall < 0.5 and any("recall" in f for f in d.failures)


def test_silero_vad_gets_a_sample_rate_a_zero_state_and_speech() -> None:
    from edge.verify.inputs import describe_generated, generated_samples

    sess, io, pre = _corpus_io("silero-vad")
    kinds = describe_generated(io, pre)
    assert kinds["sr"] == "sample rate 16000" and kinds["state"].startswith("zeros")
    assert kinds["input"].startswith("speech-like")
    samples = generated_samples(io, pre, 4, seed=1234)
    assert int(samples[0]["sr"]) == 16000 and not samples[0]["state"].any()
    ref = _reference(sess, samples)  # 8000 or 16000 only: a zero sample rate raised inside the model
    outs = compare(ref, ref, THRESHOLDS["fp32"])
    assert [o.task for o in outs] == [None, None] and not any(o.degenerate for o in outs)


def test_an_infinite_output_is_a_parity_failure_the_manifest_can_record() -> None:
    """fp16 overflow gives inf: the report fails parity and stays a valid manifest record. Before,
    numpy's nan_to_num turned the inf error into the largest float, its ratio to the reference's range
    overflowed to inf, and the manifest refused the record (tune showed every such trial as 'conversion
    failed' instead of 'parity failed')."""
    import json

    from edge.base import typedjson
    from edge.bundle.schema import OutputFigures
    from edge.verify.parity import _compare_output, thresholds_for

    rng = np.random.default_rng(0)
    refs = [rng.random((1, 100)).astype(np.float32) for _ in range(4)]
    for bad in (np.inf, -np.inf, np.nan):
        cands = [r.copy() for r in refs]
        cands[1][0, 3] = bad
        with np.errstate(over="ignore", invalid="ignore"):
            o = _compare_output("y", refs, cands, thresholds_for("fp16"), "auto")
        assert o.failures == ["NaN or Inf in the converted model's output"]
        assert o.max_abs == float("inf") and o.rel_max_abs is None
        from dataclasses import asdict

        rec = {**{k: v for k, v in asdict(o).items() if k != "failures"}, "passed": False, "failures": o.failures}
        back = json.loads(json.dumps(rec))  # Infinity survives Python's JSON, as the manifest writes it
        figures = typedjson.read(OutputFigures, back, "parity.outputs[0]")
        assert figures.max_abs == float("inf") and not figures.passed
