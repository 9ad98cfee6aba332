"""Reference pairs (``edge.verify.refpairs``): written by the build host, checked on the device on first load.

Real runtimes (onnxruntime, OpenVINO CPU, LiteRT) run real bundles of the two-input/two-output test
model. Pairs are (re)written into a copy of a converted bundle and the copy is re-hashed, so it
verifies like any bundle: the check, not verification, has to catch a wrong pair.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from edge.base.typedjson import write_json_atomic
from edge.bundle.bundle import MANIFEST, SIGNATURE, Bundle, artifact_entries
from edge.errors import BundleError, ManifestError
from edge.pipeline.request import ConvertRequest
from edge.spec import IOSpec, TensorSpec
from edge.verify.parity import THRESHOLDS, reference_outputs
from edge.verify.refpairs import (
    MAX_BYTES,
    REFERENCE_FILE,
    check_bundle,
    check_on_load,
    check_reference_pairs,
    describe,
    load_reference_pairs,
    open_checked,
    snr_db,
    write_reference_pairs,
)
from tests.support.cli import run_cli

pytest.importorskip("onnxruntime")

RUNTIMES = {"onnxruntime": "x86-cpu", "openvino": "intel-igpu", "litert": "arm-xnnpack"}


def feeds_for(io: IOSpec, n: int, seed: int = 7) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {t.name: rng.standard_normal([int(d) for d in t.shape]).astype(t.dtype) for t in io.inputs} for _ in range(n)
    ]


def rebuild(src: Bundle, dest: Path, edit: Callable[[Path], dict[str, Any] | None]) -> Bundle:
    """A copy of ``src`` whose files ``edit(dest)`` changed, re-hashed: its manifest lists every file it
    holds, so it verifies. ``edit`` returns the new ``reference_pairs`` entry (None: leave it out)."""
    shutil.copytree(src.path, dest)
    (dest / SIGNATURE).unlink(missing_ok=True)
    (dest / REFERENCE_FILE).unlink(missing_ok=True)
    entry = edit(dest)
    manifest = dict(src.manifest)
    manifest["artifacts"] = artifact_entries(dest, [f for f in dest.rglob("*") if f.is_file() and f.name != MANIFEST])
    manifest.pop("reference_pairs", None)
    if entry is not None:
        manifest["reference_pairs"] = entry
    write_json_atomic(dest / MANIFEST, manifest)
    return Bundle.open(dest, trust=False)


def with_pairs(
    src: Bundle,
    source_onnx: Path,
    dest: Path,
    *,
    samples: int = 4,
    perturb: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> Bundle:
    inputs = feeds_for(src.io, samples)
    outputs = reference_outputs(source_onnx, inputs)
    if perturb is not None:
        for o in outputs:
            perturb(o)

    def edit(d: Path) -> dict[str, Any]:
        return write_reference_pairs(
            d,
            inputs,
            outputs,
            precision=src.precision,
            reference="onnxruntime fp32 CPU on the source ONNX",
            samples=samples,
        )

    return rebuild(src, dest, edit)


@pytest.fixture(scope="module")
def converted(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Bundle]:
    """Bundles of the two-input model for each runtime, converted once per module."""
    from edge.pipeline import convert

    made: dict[str, Bundle] = {}

    def get(runtime: str) -> Bundle:
        if runtime not in made:
            if runtime == "litert":
                pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed")
                from edge import toolchains

                st = toolchains.status("tflite")
                if not st.usable:
                    pytest.skip(f"needs the tflite toolchain: {st.problem}")
            if runtime == "openvino":
                pytest.importorskip("openvino")
            out = tmp_path_factory.mktemp(f"refpairs-{runtime}") / "bundle"
            made[runtime] = convert(
                models["two_input"], RUNTIMES[runtime], out, ConvertRequest(precision="fp32", preprocess="none")
            )
        return made[runtime]

    return get


@pytest.fixture(scope="module")
def ort_bundle(
    converted: Callable[[str], Bundle], models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Bundle:
    return with_pairs(converted("onnxruntime"), models["two_input"], tmp_path_factory.mktemp("ort") / "b")


# -- writing and reading -------------------------------------------------------------------------

ODD_IO = IOSpec(
    (TensorSpec("in/put:0", (1, 3), "float32"), TensorSpec("ids", (1, 2), "int64")),
    (TensorSpec("out put/0", (1, 5), "float32"),),
)


def odd_pairs(n: int) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    ins = [
        {"in/put:0": rng.standard_normal((1, 3)).astype(np.float32), "ids": np.array([[1, 2]], np.int64)}
        for _ in range(n)
    ]
    outs = [{"out put/0": rng.standard_normal((1, 5)).astype(np.float32)} for _ in range(n)]
    return ins, outs


def test_write_then_load_keeps_odd_names_dtypes_and_values(tmp_path: Path) -> None:
    ins, outs = odd_pairs(6)
    entry = write_reference_pairs(tmp_path, ins, outs, precision="fp16", reference="test", samples=4)
    assert entry == {
        "file": REFERENCE_FILE,
        "samples": 4,
        "reference": "test",
        "thresholds": THRESHOLDS["fp16"].to_json(),
    }
    with zipfile.ZipFile(tmp_path / REFERENCE_FILE) as z:  # names never become keys
        assert sorted(z.namelist()) == sorted(
            ["names.npy"] + [f"{p}{s}_{k}.npy" for s in range(4) for p, n in (("i", 2), ("o", 1)) for k in range(n)]
        )
    pairs = load_reference_pairs(tmp_path, entry, ODD_IO)
    assert len(pairs.inputs) == 4 and pairs.inputs[3]["ids"].dtype == np.int64
    for s in range(4):
        np.testing.assert_array_equal(pairs.inputs[s]["in/put:0"], ins[s]["in/put:0"])
        np.testing.assert_array_equal(pairs.outputs[s]["out put/0"], outs[s]["out put/0"])


def test_size_cap_keeps_fewer_samples_or_none(tmp_path: Path) -> None:
    big = MAX_BYTES // 3  # bytes of one float32 input
    ins = [{"x": np.zeros(big // 4, np.float32)} for _ in range(4)]
    outs = [{"y": np.zeros(4, np.float32)} for _ in range(4)]
    entry = write_reference_pairs(tmp_path, ins, outs, precision="fp32", reference="test")
    assert entry["samples"] == 2 and "kept 2 of 4 samples" in entry["note"]
    assert (tmp_path / REFERENCE_FILE).stat().st_size <= MAX_BYTES
    huge = [{"x": np.zeros(MAX_BYTES // 4 + 1, np.float32)}]
    (tmp_path / "again").mkdir()
    entry = write_reference_pairs(tmp_path / "again", huge, outs[:1], precision="fp32", reference="test")
    assert entry["file"] is None and entry["samples"] == 0 and "over the 8 MiB cap" in entry["note"]
    assert not (tmp_path / "again" / REFERENCE_FILE).exists()


def test_mismatched_names_shapes_and_dtypes_are_refused_all_at_once(tmp_path: Path) -> None:
    ins, outs = odd_pairs(2)
    entry = write_reference_pairs(tmp_path, ins, outs, precision="fp32", reference="test")
    wrong_names = IOSpec((TensorSpec("image", (1, 3), "float32"), TensorSpec("ids", (1, 2), "int64")), ODD_IO.outputs)
    with pytest.raises(
        BundleError,
        match=r"reference\.npz: reference pairs unusable: inputs \['in/put:0', 'ids'\] "
        r"are not the bundle's \['image', 'ids'\]",
    ):
        load_reference_pairs(tmp_path, entry, wrong_names)
    wrong = IOSpec(
        (TensorSpec("in/put:0", (1, 4), "float32"), TensorSpec("ids", (1, 2), "int32")),
        (TensorSpec("out put/0", (1, 5, 1), "float32"),),
    )
    with pytest.raises(BundleError) as err:
        load_reference_pairs(tmp_path, entry, wrong)
    msg = str(err.value)
    assert str(tmp_path / REFERENCE_FILE) in msg
    assert "sample 0 input 'in/put:0' has shape [1, 3], the bundle's I/O spec says [1, 4]" in msg
    assert "sample 1 input 'ids' is int64, the bundle's I/O spec says int32" in msg
    assert "sample 0 output 'out put/0' has shape [1, 5], the bundle's I/O spec says [1, 5, 1]" in msg
    with pytest.raises(BundleError, match="missing i2_0.*the manifest says 3 samples|missing i2_0"):
        load_reference_pairs(tmp_path, {**entry, "samples": 3}, ODD_IO)


def _npz(path: Path, arrays: dict[str, Any], *, allow_pickle: bool = False) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for key, a in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(a), allow_pickle=allow_pickle)
            z.writestr(key, buf.getvalue())


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(Path(os.environ["REFPAIRS_MARKER"])),))


def test_crafted_archives_are_refused_without_running_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ins, outs = odd_pairs(1)
    entry = write_reference_pairs(tmp_path, ins, outs, precision="fp32", reference="test", samples=1)
    good = dict(np.load(tmp_path / REFERENCE_FILE))
    f = tmp_path / REFERENCE_FILE
    marker = tmp_path / "pickle-ran"
    monkeypatch.setenv("REFPAIRS_MARKER", str(marker))
    pickled = {**{f"{k}.npy": v for k, v in good.items()}, "o0_0.npy": np.array([_Boom()], dtype=object)}
    cases = {
        "pickled": (pickled, "Object arrays cannot be loaded"),
        "extra member": ({**{f"{k}.npy": v for k, v in good.items()}, "../evil.npy": np.zeros(1)}, "unexpected member"),
        "missing member": ({f"{k}.npy": v for k, v in good.items() if k != "i0_1"}, "missing i0_1"),
        "names not JSON": ({**{f"{k}.npy": v for k, v in good.items()}, "names.npy": np.array("{")}, "JSONDecodeError"),
        "names as numbers": (
            {**{f"{k}.npy": v for k, v in good.items()}, "names.npy": np.arange(3)},
            "'names' is not a JSON string",
        ),
    }
    for what, (arrays, needle) in cases.items():
        f.unlink()
        _npz(f, arrays, allow_pickle=True)
        with pytest.raises(BundleError, match=needle) as err:
            load_reference_pairs(tmp_path, entry, ODD_IO)
        assert f"{f}: reference pairs unusable" in str(err.value), what
    f.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(BundleError, match="not an npz archive"):
        load_reference_pairs(tmp_path, entry, ODD_IO)
    f.unlink()
    f.symlink_to(tmp_path / "elsewhere.npz")
    with pytest.raises(BundleError, match="not a regular file|cannot be read"):
        load_reference_pairs(tmp_path, entry, ODD_IO)
    assert not marker.exists(), "a pickle in the reference file ran code"


def test_snr() -> None:
    ref = [np.array([3.0, 4.0])]
    assert snr_db(ref, [np.array([3.0, 4.0])]) is None  # exact: no error to measure
    assert snr_db(ref, [np.array([3.0, 4.5])]) == pytest.approx(10 * np.log10(25 / 0.25), abs=1e-3)


# -- on real runtimes ----------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_pairs_pass_on_the_runtime_that_runs_the_bundle(
    runtime: str, converted: Callable[[str], Bundle], models: dict[str, Path], tmp_path: Path
) -> None:
    b = with_pairs(converted(runtime), models["two_input"], tmp_path / "b")
    assert b.info.reference_pairs is not None and b.info.reference_pairs.samples == 4
    assert REFERENCE_FILE in {a.path for a in b.info.artifacts}
    with open_checked(b, mode=True) as r:
        res = r.info.details["reference_check"]
        assert r.info.runtime.split()[0] in ("onnxruntime", "openvino", "litert", "ai-edge-litert", "LiteRT")
        # OpenVINO computes in bf16 where the build's bf16 parity trial passed on a CPU listing BF16 (#25)
        bf16 = r.info.precision_used == "bf16"
    assert res["passed"] is True, res
    assert res["samples"] == 4 and res["recorded"] is False
    assert {o["name"] for o in res["outputs"]} == {"features", "embedding"}
    for o in res["outputs"]:
        assert o["cosine"] > (0.9999 if bf16 else 0.99999) and o["passed"], o
        assert o["snr_db"] is None or o["snr_db"] > (30 if bf16 else 60), o
    assert res["thresholds"]["min_cosine"] >= THRESHOLDS["fp32"].min_cosine or runtime == "openvino"
    json.dumps(res, allow_nan=False)  # JSON as it is


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_runner_computing_something_else_fails_the_check(
    runtime: str, converted: Callable[[str], Bundle], models: dict[str, Path], tmp_path: Path
) -> None:
    def perturb(o: dict[str, np.ndarray]) -> None:
        o["embedding"] = o["embedding"] + np.linspace(-1, 1, o["embedding"].size, dtype=np.float32).reshape(
            o["embedding"].shape
        )

    b = with_pairs(converted(runtime), models["two_input"], tmp_path / "b", perturb=perturb)
    b.verify()  # the file is listed and hashed: verification passes, the check must catch it
    with open_checked(b, mode=True) as r:
        res = r.info.details["reference_check"]
    assert res["passed"] is False
    bad = {o["name"]: o for o in res["outputs"]}
    assert bad["features"]["passed"] and not bad["embedding"]["passed"]
    assert any(f.startswith("embedding: mean cosine") for f in res["failures"]), res["failures"]
    assert bad["embedding"]["snr_db"] < 30
    line = describe(res)
    assert line is not None and "\n" not in line and "embedding: mean cosine" in line


def _with_parity(b: Bundle, **edit: Any) -> Bundle:
    """``b`` with its manifest's parity evidence edited (``samples``, ``accepted_failure``...; ``outputs``: name ->
    fields), as a build host that measured other figures would have written it."""
    m = json.loads((b.path / MANIFEST).read_text())
    for name, fields in edit.pop("outputs", {}).items():
        next(o for o in m["parity"]["outputs"] if o["name"] == name).update(fields)
    m["parity"].update(edit)
    write_json_atomic(b.path / MANIFEST, m)
    return Bundle.open(b.path, trust=False)


def _check(b: Bundle) -> dict[str, Any]:
    with b.open_runner() as r:
        return check_reference_pairs(b, r)


def _shift(scale: float) -> Callable[[dict[str, np.ndarray]], None]:
    def perturb(o: dict[str, np.ndarray]) -> None:
        e = o["embedding"]
        noise = np.random.default_rng(3).standard_normal(e.shape).astype(np.float32)
        o["embedding"] = e + scale * float(np.linalg.norm(e)) / float(np.linalg.norm(noise)) * noise

    return perturb


def test_fewer_pairs_than_parity_are_judged_by_what_parity_accepted(
    converted: Callable[[str], Bundle], models: dict[str, Path], tmp_path: Path
) -> None:
    """The pairs are a few of parity's samples: a mean over them can fall under the rule where parity's mean
    over all did not (PP-OCRv6 rec int8: 0.975 on 2 pairs, 0.986 on 32). Parity's worst sample is then the floor,
    with the device's slack; below it, and wherever parity did not pass on its own, the rule holds."""
    # pairs whose reference is off by ~10 % of the norm: cosine ~0.995, under fp32's 0.99999
    src = converted("onnxruntime")
    b = with_pairs(src, models["two_input"], tmp_path / "b", perturb=_shift(0.1))
    # parity's worst sample and largest error, on this build host
    # (over 1024 samples: a mean >= 0.99999 over 32 would bound the worst at 0.99968, and the device holds a record
    # to that, issue #33)
    worst = {"embedding": {"cosine": 0.99999, "cosine_min": 0.99, "snr_db_min": 19.0, "max_abs": 0.2}}
    ok = _check(_with_parity(b, samples=1024, outputs=worst))
    emb = {o["name"]: o for o in ok["outputs"]}["embedding"]
    assert ok["passed"] is True and emb["cosine"] < THRESHOLDS["fp32"].min_cosine, ok["failures"]
    assert emb["limits"]["min_cosine"] == pytest.approx(1 - 0.01 * 10**0.1)
    assert emb["limits"]["min_snr_db"] == pytest.approx(18.0)
    feat = {o["name"]: o for o in ok["outputs"]}["features"]  # parity's figures for it were not edited: the rule
    assert feat.get("limits", ok["thresholds"])["min_cosine"] == THRESHOLDS["fp32"].min_cosine
    assert any("4 of parity's 1024 samples" in n and "parity's worst sample 0.990000" in n for n in ok["notes"]), ok
    # the same pairs where parity was accepted as a failure, ran on these 4 samples only, or over 32 (a worst of
    # 0.99 is impossible beside a mean of 0.99999 there): the rule
    for edit in ({"samples": 1024, "accepted_failure": True, "passed": False}, {"samples": 4}, {"samples": 32}):
        bad = _check(_with_parity(b, outputs=worst, **edit))
        assert bad["passed"] is False, (edit, bad)
        assert bad["failures"][0].startswith("embedding: mean cosine") and "0.99999" in bad["failures"][0]
    # a device far under parity's worst sample fails whatever parity saw
    far = with_pairs(src, models["two_input"], tmp_path / "far", perturb=_shift(0.5))
    res = _check(_with_parity(far, samples=1024, outputs=worst))
    assert res["passed"] is False and any("mean cosine" in f for f in res["failures"]), res


def test_pair_limits_small_samples_and_agreement_counts() -> None:
    """Task agreement over fewer than MIN_TOP1_SAMPLES pairs is reported, not gated; over more, parity's
    disagreements may all fall among the pairs (26/32 top-1 is 10/16 at worst)."""
    from edge.verify.parity import OutputParity
    from edge.verify.refpairs import MIN_TOP1_SAMPLES, pair_limits

    th = THRESHOLDS["int8"]
    o = OutputParity("y", 0.1, 0.01, 0.99, 0.98, 0.5, ref_min=-1.0, ref_max=1.0, task="classifier", top5=1.0)
    few, why = pair_limits(o, th, None, MIN_TOP1_SAMPLES - 1, 32, True)
    assert few.min_top1 == 0.0 and few.min_top5 is None and few.min_cosine == th.min_cosine
    assert "reported, not gated" in why[0]
    built = OutputParity("y", 0.2, 0.01, 0.985, 0.97, 26 / 32, top5=1.0, task="classifier")
    many, why = pair_limits(o, th, built, 16, 32, True)
    assert many.min_top1 == pytest.approx(10 / 16) and many.min_top5 == th.min_top5
    assert many.min_cosine == pytest.approx(1 - 0.03 * 10**0.1)  # parity's worst sample, less 1 dB
    same, why = pair_limits(o, th, built, 16, 32, False)  # parity did not pass: nothing loosened
    assert same == th and why == []


def test_a_pooled_cosine_is_bounded_by_the_worst_sample_snr() -> None:
    """A small output's parity cosine is pooled over all samples (``cosine_samples`` 0): no worst sample, and a
    subset's pooled cosine may be under it (PP-OCR cls int8 on OpenVINO: 0.988 over 32, 0.978 over its 16 pairs;
    the check failed a bundle parity had passed). The worst sample's SNR bounds any subset: cos >= sqrt(1 - r)."""
    import math

    from edge.verify.parity import OutputParity
    from edge.verify.refpairs import DEVICE_SLACK_DB, pair_limits

    th = THRESHOLDS["int8"]
    o = OutputParity("y", 0.4, 0.08, 0.978, 0.978, 1.0, ref_min=0.0, ref_max=1.0, task="classifier")
    built = OutputParity("y", 0.39, 0.05, 0.988, 0.988, 1.0, snr_db_min=2.13, cosine_samples=0, task="classifier")
    lim, why = pair_limits(o, th, built, 16, 32, True)
    assert lim.min_cosine == pytest.approx(math.sqrt(1 - 10 ** (-(2.13 - DEVICE_SLACK_DB) / 10)))
    assert 0.03 < lim.min_cosine < 0.978 and any("pooled cosine >=" in n for n in why), why
    # per-sample cosines (cosine_samples > 0): parity's worst sample is the floor, as before
    built.cosine_samples, built.cosine_min = 32, 0.97
    lim, _ = pair_limits(o, th, built, 16, 32, True)
    assert lim.min_cosine == pytest.approx(1 - 0.03 * 10**0.1)


def test_an_altered_reference_file_fails_verification(ort_bundle: Bundle, tmp_path: Path) -> None:
    b = Bundle.open(shutil.copytree(ort_bundle.path, tmp_path / "b"))
    f = b.path / REFERENCE_FILE
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"reference\.npz: sha256 differs from the manifest"):
        Bundle.open(b.path)
    f.unlink()
    with pytest.raises(BundleError, match=r"reference\.npz: missing"):
        Bundle.open(b.path)


def test_a_pickled_reference_file_is_a_failed_check_not_a_crash(
    ort_bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pickle-ran"
    monkeypatch.setenv("REFPAIRS_MARKER", str(marker))

    def edit(d: Path) -> dict[str, Any]:
        good = dict(np.load(ort_bundle.path / REFERENCE_FILE))
        _npz(
            d / REFERENCE_FILE,
            {**{f"{k}.npy": v for k, v in good.items()}, "o0_0.npy": np.array([_Boom()], dtype=object)},
            allow_pickle=True,
        )
        return ort_bundle.manifest["reference_pairs"]

    b = rebuild(ort_bundle, tmp_path / "b", edit)  # verifies: the pickle is listed and hashed
    with open_checked(b, mode=True) as r:
        res = r.info.details["reference_check"]
    assert res["passed"] is False and "Object arrays cannot be loaded" in res["error"]
    assert str(b.path / REFERENCE_FILE) in res["error"]
    assert not marker.exists()


def test_old_bundles_without_pairs_open_and_skip(ort_bundle: Bundle, tmp_path: Path) -> None:
    b = rebuild(ort_bundle, tmp_path / "b", lambda d: None)
    assert b.info.reference_pairs is None
    with b.open_runner() as r:  # default: no check (conversion's parity, load-time benchmarks)
        assert "reference_check" not in r.info.details
    with open_checked(b, mode=True) as r:
        res = r.info.details["reference_check"]
        assert res["passed"] is None and "no reference pairs" in res["skipped"]
        assert check_reference_pairs(b, r)["passed"] is None
    assert describe(res) is None


def test_manifest_entry_is_typed_and_strict(ort_bundle: Bundle) -> None:
    m = ort_bundle.manifest
    entry = m["reference_pairs"]
    assert ort_bundle.info.reference_pairs.thresholds.min_cosine == THRESHOLDS["fp32"].min_cosine
    for bad, needle in [
        ({**entry, "file": "other.npz"}, "reference_pairs.file.*not one of the artifacts"),
        ({**entry, "file": "model.onnx"}, "reference_pairs.file.*primary artifact"),
        ({**entry, "file": None}, "reference_pairs.file"),
        ({**entry, "file": "../reference.npz"}, "reference_pairs.file"),
        ({**entry, "samples": 65}, "reference_pairs.samples"),
        ({**entry, "extra": 1}, "reference_pairs"),
        ({k: v for k, v in entry.items() if k != "thresholds"}, "reference_pairs.thresholds"),
    ]:
        with pytest.raises(ManifestError, match=needle):
            Bundle(ort_bundle.path, {**m, "reference_pairs": bad})
    none = {"file": None, "samples": 0, "reference": "x", "thresholds": entry["thresholds"], "note": "too big"}
    assert Bundle(ort_bundle.path, {**m, "reference_pairs": none}).info.reference_pairs.note == "too big"


# -- the device store records the result ---------------------------------------------------------


def test_the_store_records_the_check_once_and_reuses_it(
    ort_bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge.store.local import DeviceStore, store_holding
    from edge.verify import refpairs

    store = DeviceStore(tmp_path / "store", trust=False)
    store.install(ort_bundle)
    b = store.bundle()
    calls = []
    real = refpairs.check_reference_pairs
    monkeypatch.setattr(refpairs, "check_reference_pairs", lambda *a: calls.append(1) or real(*a))
    with open_checked(b, mode="first", records=store) as r:
        first = r.info.details["reference_check"]
    assert first["passed"] is True and first["recorded"] is False and len(calls) == 1
    record = tmp_path / "store" / "checks" / f"{b.id}.json"
    on_disk = json.loads(record.read_text())
    assert on_disk["passed"] is True and on_disk["bundle_id"] == b.id and "recorded" not in on_disk
    assert on_disk["runner"]["device_used"] == r.info.device_used
    assert not [p for p in record.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    with open_checked(b, mode="first", records=store) as r:
        again = r.info.details["reference_check"]
    assert again["recorded"] is True and len(calls) == 1
    assert again["checked_utc"] == first["checked_utc"]
    with open_checked(b, mode=True, records=store) as r:  # asked: checked again
        assert r.info.details["reference_check"]["recorded"] is False and len(calls) == 2
    # another device or runtime than the record's: checked again
    on_disk["runner"]["device_used"] = "some other device"
    record.write_text(json.dumps(on_disk))
    with open_checked(b, mode="first", records=store) as r:
        assert r.info.details["reference_check"]["recorded"] is False and len(calls) == 3
    # a record that is not one is ignored, then replaced
    record.write_text("{not json")
    assert store.reference_check(b.id) is None
    # `edgekit run`/`bench` find the store a bundle lies in, through `current` too
    holder = store_holding(tmp_path / "store" / "current")
    assert holder is not None and holder.root == tmp_path / "store"
    assert store_holding(ort_bundle.path) is None
    res = check_bundle(Bundle.open(tmp_path / "store" / "current"))
    assert res["recorded"] is False and len(calls) == 4 and store.reference_check(b.id)["passed"] is True


def test_a_read_only_store_still_gives_the_result(ort_bundle: Bundle, tmp_path: Path) -> None:
    class Refusing:
        def reference_check(self, bundle_id: str) -> None:
            return None

        def record_reference_check(self, bundle_id: str, result: Any) -> None:
            from edge.errors import DeployError

            raise DeployError("device store /x: Read-only file system")

    with ort_bundle.open_runner() as r:
        res = check_on_load(ort_bundle, r, records=Refusing())
    assert res["passed"] is True and "Read-only" in res["record_error"]


# -- the agent and the CLI -----------------------------------------------------------------------


def _agent_birth(store_root: Path) -> tuple[dict[str, Any], Any]:
    from edge.agent.agent import Agent, AgentConfig
    from edge.mqtt.client import BrokerConfig

    a = Agent(AgentConfig("lab", "cam-01", broker=BrokerConfig(host="127.0.0.1", port=1), store=store_root))
    try:
        a._load()
        return a.birth_body(), (a.state, a.state_detail)
    finally:
        a.close()


def test_agent_birth_carries_the_check_and_a_failure_does_not_stop_it(
    ort_bundle: Bundle, converted: Callable, models: dict[str, Path], tmp_path: Path
) -> None:
    from edge.mqtt.payloads import load_schema, message
    from edge.store.local import DeviceStore

    schema = load_schema()
    birth_schema = schema["$defs"]["birth"]["properties"]["reference_check"]
    from tests.agent.test_agent_mqtt import schema_errors

    DeviceStore(tmp_path / "s1", trust=False).install(ort_bundle)
    body, state = _agent_birth(tmp_path / "s1")
    assert state == ("running", None)
    assert body["reference_check"]["passed"] is True and "reference_check" not in body["runner"]["details"]
    msg = message("birth", "lab", "cam-01", 1, 0, {**body, "connection": 1})
    assert not schema_errors(msg, schema, schema), schema_errors(msg, schema, schema)
    _agent_birth(tmp_path / "s1")  # loads again: the record is reused
    assert (tmp_path / "s1" / "checks" / f"{ort_bundle.id}.json").is_file()

    def perturb(o: dict[str, np.ndarray]) -> None:
        o["features"] = -o["features"]

    bad = with_pairs(converted("onnxruntime"), models["two_input"], tmp_path / "bad", perturb=perturb)
    DeviceStore(tmp_path / "s2", trust=False).install(bad)
    body, (st, detail) = _agent_birth(tmp_path / "s2")
    assert st == "running" and detail is not None and detail.startswith(f"reference check failed for {bad.id}")
    assert body["reference_check"]["passed"] is False
    assert not schema_errors(body["reference_check"], birth_schema, schema)
    assert schema_errors({"passed": "yes"}, birth_schema, schema)  # the schema does say something


def test_bench_and_run_warn_in_one_line(converted: Callable, models: dict[str, Path], tmp_path: Path) -> None:
    def perturb(o: dict[str, np.ndarray]) -> None:
        o["embedding"] = o["embedding"] * 3 + 1

    bad = with_pairs(converted("onnxruntime"), models["two_input"], tmp_path / "bad", perturb=perturb)
    p = run_cli("bench", str(bad.path), "-n", "3", "--warmup", "0")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "reference check failed" in ln]
    assert (
        len(lines) == 1
        and lines[0].startswith("warning: reference check failed for")
        and "embedding: mean cosine" in lines[0]
    ), p.stderr
    p = run_cli("run", str(bad.path), "--synthetic", "32x32", "-n", "2", "--json")
    assert "Traceback" not in p.stderr, p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("warning: reference check failed")], p.stderr
