"""The agent never checks a runner while its inference thread infers on it (issue #33, item 6).

At the end of a rollout's watch the agent runs the bundle's reference pairs again on the live runner
(``Applier._drift``). LiteRT's interpreter and OpenVINO's infer request are not thread-safe: with the
inference thread running, 20 checks from another thread failed 8 (LiteRT: "There is at least 1 reference
to internal data in the interpreter...") and 12 (OpenVINO) times, and good rollouts were rolled back
(``watch_reference_drift``). Here each runtime's real runner infers as fast as its source goes, beside a
busy process that takes a core, while 20 checks run through ``InferenceWorker.check_live`` (what the drift
check calls): every one must pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.agent.sources import SyntheticSource
from edge.agent.worker import InferenceWorker
from edge.bundle.bundle import Bundle
from edge.pipeline import convert
from tests.support.cli import wait_for
from tests.support.corpus import corpus_model

# runtime -> (model, target): a bundle each runtime's runner opens on this host
CASES = {
    "onnxruntime": ("tiny", "x86-cpu"),
    "openvino": ("tiny", "intel-igpu"),  # the CPU plugin here (the iGPU's declared fallback)
    "litert": ("mp-iris-landmark", "arm-xnnpack"),  # a TFLite source: no onnx2tf conversion (seconds)
}
CHECKS = 20


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    return {}


def _bundle(runtime: str, built: dict[str, Bundle], models: dict[str, Path], tmp: Path) -> Bundle:
    if runtime not in built:
        model, target = CASES[runtime]
        src = models[model] if model in models else corpus_model(model)
        built[runtime] = convert(src, target, tmp / runtime)
    return built[runtime]


@pytest.fixture
def busy_process() -> Iterator[subprocess.Popen[bytes]]:
    """Another process spinning on a core for the test's length (a busy device)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _check(worker: InferenceWorker, bundle: Bundle) -> dict[str, Any]:
    """One check as the drift check runs it; an exception counts as a failed check (the drift check's own rule)."""
    try:
        return worker.check_live(bundle)
    except Exception as e:  # noqa: BLE001 - counted, as Applier._drift counts it
        return {"passed": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}


@pytest.mark.parametrize("runtime", sorted(CASES))
def test_reference_checks_beside_the_inference_thread_all_pass(
    runtime: str,
    built: dict[str, Bundle],
    models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    busy_process: Any,
) -> None:
    bundle = _bundle(runtime, built, models, tmp_path_factory.mktemp("infer-lock"))
    with bundle.open_runner() as runner:
        assert runner.info.runtime.split()[0] == {"litert": "ai-edge-litert"}.get(runtime, runtime)
        worker = InferenceWorker(runner, SyntheticSource(runner, 10_000.0), budget_ms=1e9)
        worker.start()
        try:
            wait_for(lambda: worker.take_window()[0], 60, "the inference thread's first frames")
            results = [_check(worker, bundle) for _ in range(CHECKS)]
            wait_for(lambda: worker.take_window()[0], 60, "frames after the checks (the thread still infers)")
        finally:
            worker.stop()
    assert worker.error is None, worker.error
    failed = [(r.get("failures") or r.get("error") or r) for r in results if r.get("passed") is not True]
    assert not failed, f"{len(failed)} of {CHECKS} checks failed on {runtime}: {failed[:3]}"
