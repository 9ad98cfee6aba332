"""OpenVINO streams for ``edgekit tune``'s throughput objective: the ``num_streams`` runner option reaches OpenVINO
(read back from the compiled model), nonsense combinations are refused in one line, the concurrent path (an
``AsyncInferQueue`` with the compiled model's optimal number of requests in flight) returns what the synchronous
path returns, the throughput measurement says how many requests were in flight, and the space holds
``num_streams`` for the throughput objective only. Real OpenVINO on a tiny model built here; no timings asserted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.backends.openvino.format import STREAMS
from edge.backends.openvino.run import OpenVINORunner
from edge.bundle.schema import Invalid, RunnerSpec, check_runner
from edge.errors import EdgeError
from edge.pipeline.overlay import read_overlay, write_overlay
from edge.pipeline.request import ConvertRequest
from edge.targets import get_target
from edge.tune.measure import measure_infer
from edge.tune.search import Schedule, TuneOptions, tune
from edge.tune.space import build_space, usable_cpus

CPUS = usable_cpus()
needs_two = pytest.mark.skipif(CPUS < 2, reason="two streams need two CPUs this process may use")


@pytest.fixture(scope="module")
def ir(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny CNN as an OpenVINO IR (OpenVINO's own converter; its telemetry off, as edgekit runs it)."""
    from edge.backends.openvino.format import disable_openvino_telemetry

    disable_openvino_telemetry()
    import openvino as ov

    xml = tmp_path_factory.mktemp("ir") / "model.xml"
    ov.save_model(ov.convert_model(str(models["tiny"])), str(xml))
    return xml


def open_trial_runner(xml: Path, **options: object) -> OpenVINORunner:
    return OpenVINORunner(xml, options={"device": ["CPU"], **options})


def _read_back(runner: OpenVINORunner) -> tuple[int, int, str]:
    """What the compiled model itself reports: streams, optimal requests, hint."""
    import openvino.properties as props
    import openvino.properties.hint as hints

    c = runner._compiled
    return (
        int(c.get_property(props.num_streams)),
        int(c.get_property(props.optimal_number_of_infer_requests)),
        str(c.get_property(hints.performance_mode)),
    )


def _feeds(runner: OpenVINORunner, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {s.name: rng.standard_normal([int(d) for d in s.shape]).astype(s.dtype) for s in runner.inputs}
        for _ in range(n)
    ]


# -- the runner option --------------------------------------------------------------------------------


def test_num_streams_reaches_openvino_and_is_read_back(ir: Path) -> None:
    asked = [1, 2] if CPUS >= 2 else [1]
    for n in asked:
        with open_trial_runner(ir, performance_hint="THROUGHPUT", num_streams=n) as r:
            streams, nireq, hint = _read_back(r)
            assert streams == n and hint == "THROUGHPUT"
            d = r.info.details
            assert d["num_streams"] == streams and d["num_streams_option"] == n and "streams_note" not in d
            assert d["optimal_requests"] == nireq and r.requests == nireq >= 1
    with open_trial_runner(ir, performance_hint="THROUGHPUT", num_streams="auto") as r:  # OpenVINO's own choice
        streams, nireq, _ = _read_back(r)
        assert r.info.details["num_streams_option"] == "AUTO" and r.info.details["num_streams"] == streams >= 1
    # more streams than CPUs: OpenVINO runs what it can; a difference from what was asked is said, not hidden
    many = min(4 * CPUS, 1024)
    with open_trial_runner(ir, performance_hint="THROUGHPUT", num_streams=many) as r:
        streams, _, _ = _read_back(r)
        d = r.info.details
        assert d["num_streams"] == streams
        assert (d.get("streams_note") == f"asked for {many} streams; CPU runs {streams}") == (streams != many)
    # not set: the hint decides (LATENCY: one stream, one request here), recorded as read back
    with open_trial_runner(ir) as r:
        streams, nireq, hint = _read_back(r)
        assert hint == "LATENCY" and r.info.details["num_streams_option"] == 0
        assert r.info.details["num_streams"] == streams and r.requests == nireq


@needs_two
def test_latency_hint_with_streams_is_what_the_space_prunes(ir: Path) -> None:
    """The space prunes num_streams under LATENCY because OpenVINO lets NUM_STREAMS override the hint's one stream
    (it keeps reporting LATENCY): checked against the installed OpenVINO, so the reason stays true."""
    with open_trial_runner(ir, performance_hint="LATENCY", num_streams=2) as r:
        assert _read_back(r) == (2, 2, "LATENCY")


@pytest.mark.parametrize(
    "options, message",
    [
        # the runner reads its options through their one declaration (OpenVINOOptions): the manifest's rule and words
        ({"num_streams": -1}, "option num_streams must be between 0 and 1024, got -1"),
        ({"num_streams": "many"}, 'option num_streams must be an integer or one of "AUTO", "auto", got "many"'),
        ({"num_streams": True}, 'option num_streams must be an integer or one of "AUTO", "auto", got true'),
        ({"num_streams": 5000}, "option num_streams must be between 0 and 1024, got 5000"),
        ({"num_streams": "AUTO"}, "num_streams AUTO with performance_hint LATENCY"),
        ({"num_streams": 2, "num_threads": 1, "performance_hint": "THROUGHPUT"}, "num_streams 2 with num_threads 1"),
    ],
)
def test_nonsense_streams_are_refused_in_one_line(ir: Path, options: dict, message: str) -> None:
    with pytest.raises(EdgeError, match=message) as e:
        open_trial_runner(ir, **options)
    assert "\n" not in str(e.value)


def test_manifest_takes_num_streams_typed() -> None:
    for ok in (2, "AUTO", 0):
        check_runner(RunnerSpec("openvino", {"num_streams": ok}))
    for bad in (-1, "x", 2.5):
        with pytest.raises(Invalid, match="runner.options.num_streams"):
            check_runner(RunnerSpec("openvino", {"num_streams": bad}))


# -- the concurrent path ----------------------------------------------------------------------------


def test_concurrent_outputs_are_the_synchronous_ones(ir: Path) -> None:
    with open_trial_runner(ir, performance_hint="THROUGHPUT", num_streams=min(2, CPUS)) as r:
        feeds = _feeds(r, 7)
        sync = [r.infer(f) for f in feeds]
        for requests in (None, 3):  # the optimal number, and more requests than streams
            got = r.infer_concurrent(feeds, requests=requests)
            assert len(got) == len(feeds)
            for a, b in zip(got, sync):  # in order: every sample differs, so a swap would fail
                assert a.keys() == b.keys()
                for k in a:
                    np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)
        first = next(iter(sync[0]))
        assert not np.allclose(sync[0][first], sync[1][first])
        wall, lat = r.run_concurrent(feeds[0], 10)
        assert wall > 0 and len(lat) == 10 and all(x > 0 for x in lat)
        with pytest.raises(EdgeError, match="requests in flight must be from 1 to 256"):
            r.run_concurrent(feeds[0], 2, requests=0)


def test_throughput_measures_openvino_with_its_requests_in_flight(ir: Path, models: dict[str, Path]) -> None:
    from edge.backends.onnxruntime.run import OnnxRuntimeRunner

    tp = open_trial_runner(ir, performance_hint="THROUGHPUT", num_streams=min(2, CPUS))
    lat = open_trial_runner(ir, performance_hint="LATENCY")
    ort = OnnxRuntimeRunner(models["tiny"])
    opened = {n: (r, _feeds(r, 1)[0]) for n, r in (("tp", tp), ("lat", lat), ("ort", ort))}
    try:
        got = measure_infer(opened, "throughput", reps=2, iters=8, warmup=1, batches={"tp": 2})
        assert got["tp"]["requests"] == _read_back(tp)[1] == tp.requests
        assert got["lat"]["requests"] == 1 and got["ort"]["requests"] == 1  # one request at a time
        for m in got.values():
            assert len(m["rep_scores"]) == 2 and all(x < 0 for x in m["rep_scores"]) and m["fps"] > 0
        # the latency objective: one synchronous request at a time, whatever the hint
        assert measure_infer(opened, "latency", reps=1, iters=4, warmup=0)["tp"]["requests"] == 1
    finally:
        for r, _ in opened.values():
            r.close()


# -- the space ---------------------------------------------------------------------------------------


def test_throughput_space_has_streams_with_the_throughput_hint_only(tmp_path: Path) -> None:
    profile = get_target("x86-cpu")
    threads = sorted({1, min(2, CPUS)})
    space = build_space(profile, objective="throughput", runners=["openvino"], precisions=["fp32"], threads=threads)
    opts = [dict(c.options) for c in space.configs]
    tried = {(o["performance_hint"], o["num_threads"], o.get("num_streams")) for o in opts}
    want = {("LATENCY", t, None) for t in threads} | {
        ("THROUGHPUT", t, s or None) for t in threads for s in STREAMS if s <= min(t, CPUS)
    }
    assert tried == want and len(opts) == len(want)
    assert any(o.get("num_streams") for o in opts)
    streamed = next(c for c in space.configs if dict(c.options).get("num_streams") == 1)
    assert "streams=1" in streamed.label() and "num_streams=1" in streamed.id
    # a winner with streams: its overlay keeps the option through the overlay file's own checks
    path = write_overlay(tmp_path / "tuned.toml", space.overlay(profile, streamed, tuned={}), ["test"])
    assert read_overlay(path).run_options["num_streams"] == 1
    # the hint's own choice stays the configuration it was before the option existed (its id unchanged)
    assert "openvino/fp32/num_threads=1/performance_hint=THROUGHPUT" in {c.id for c in space.configs}
    pruned = "\n".join(space.pruned)
    assert "openvino num_streams with performance_hint=LATENCY" in pruned
    if CPUS >= 2:
        assert "openvino num_streams=2 with num_threads=1" in pruned
    for objective in ("latency", "e2e"):
        other = build_space(
            profile,
            objective=objective,
            runners=["openvino"],
            precisions=["fp32"],
            threads=threads,
            video=objective == "e2e",
        )
        assert not any("num_streams" in dict(c.options) for c in other.configs)
        assert f"openvino num_streams: only for the throughput objective (objective {objective}" in "\n".join(
            other.pruned
        )


def test_throughput_tune_records_requests_and_streams(tmp_path: Path, models: dict[str, Path], ir: Path) -> None:
    r = tune(
        models["tiny"],
        "x86-cpu",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "out",
            objective="throughput",
            runners=["openvino"],
            precisions=["fp32"],
            threads=[CPUS],
            batches=[1],
            schedule=Schedule(reps=2, iters=6, warmup=1),
            pictures=False,
        ),
    )
    measured = [t for t in r.trials if t.get("result")]
    assert r.winner is not None and any("num_streams" in t["options"] for t in measured)
    for t in measured:
        opts = {k: v for k, v in t["options"].items() if k != "device"}
        assert "num_streams" not in opts or opts["performance_hint"] == "THROUGHPUT"
        with open_trial_runner(
            ir, **opts
        ) as runner:  # what OpenVINO reports for the trial's options: its requests in flight
            assert t["result"]["requests"] == runner.requests == _read_back(runner)[1]
    assert all("requests" in (t["result"] or {"requests": 0}) for t in r.to_json()["trials"])
