"""The typed manifest: its published JSON Schema, its limits, and runner options (issue 11).

The dataclasses in ``edge.bundle.schema`` are the one declaration; the schema file is generated
from them. These tests keep the file in step, check that jsonschema and edgekit's reader agree on
real and mutated manifests, and that every limit is one ``ManifestError`` line.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.backends.runner import RUNNERS
from edge.base.typedjson import Invalid, loads_strict, read, to_json
from edge.bundle.bundle import Bundle
from edge.bundle.schema import (
    MAX_BYTES,
    Manifest,
    RunnerSpec,
    builtin_runner_options,
    check_runner,
    device_only_hint,
    manifest_json_schema,
    published_schema,
)
from edge.errors import ManifestError
from edge.pipeline import convert
from edge.targets import load_targets
from tests.bundle.test_manifest_fuzz import _paths

jsonschema = pytest.importorskip("jsonschema")  # the dev extra installs it


def _validator() -> Any:
    """Draft 2020-12 with ECMA-262 ``pattern`` semantics: ``$`` ends the string (Python's ``re`` would
    also accept a newline before it, which no JSON Schema validator in another language does)."""

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Any:
        if isinstance(instance, str) and not re.search(patrn[:-1] + r"\Z" if patrn.endswith("$") else patrn, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": pattern})
    return cls(published_schema())


@pytest.fixture(scope="module")
def manifest(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    b = convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("schema") / "b")
    return b.path, copy.deepcopy(b.manifest)


def test_published_schema_is_generated_from_the_dataclasses() -> None:
    assert published_schema() == manifest_json_schema(), (
        "edge/bundle/manifest.schema.json is stale: regenerate it with `python -m edge.bundle.schema`"
    )
    jsonschema.Draft202012Validator.check_schema(published_schema())


def test_real_manifests_pass_both(manifest: tuple[Path, dict[str, Any]]) -> None:
    _, m = manifest
    skipped = {**m, "parity": {"passed": None, "skipped": "runner cannot run on this host: needs the device"}}
    llm = {
        **m,
        "kind": "llm",
        "precision": "q4_k_m",
        "format": "gguf",
        "parity": {
            "kind": "llm",
            "passed": True,
            "quant": "q4_k_m",
            "tokens": 256,
            "kl_mean": 0.01,
            "kl_p99": 0.1,
            "kl_max": 0.3,
            "top1": 0.97,
            "thresholds": {"max_kl_mean": 0.1, "min_top1": 0.85},
            "reference": "source GGUF in llama.cpp, same tokens",
            "accepted_failure": False,
        },
        "runner": {
            "name": "llama.cpp",
            "options": {"n_threads": 0, "n_ctx": 2048, "n_gpu_layers": -1, "require_gpu": True},
        },
        "preprocess": None,
    }
    # a bundle converted from an `edgekit tune` overlay says so (edge.pipeline.overlay.TunedOverlay.manifest_record)
    tuned = {
        **m,
        "tuned": {
            "overlay_sha256": "ab" * 32,
            "configuration": "openvino/fp32/num_threads=2/performance_hint=LATENCY",
            "objective": "e2e",
            "tuned_on": {"os": "linux", "arch": "x86_64", "cpu": "AMD EPYC", "isa": ["avx2"], "cpus": 2},
            "same_device_class": False,
            "device_class": "different device class: ...",
            "created_utc": "2026-11-25T14:00:00+00:00",
        },
    }
    bare_tuned = {**m, "tuned": {"overlay_sha256": "cd" * 32}}  # an overlay without a [tuned] table
    v = _validator()
    for doc in (m, skipped, llm, tuned, bare_tuned):
        assert not [e.message for e in v.iter_errors(doc)]
        typed = read(Manifest, doc)
        assert read(Manifest, to_json(typed)) == typed  # round trip


def test_runner_option_types_match_what_each_runner_declares() -> None:
    """One declaration: a runner's option names and descriptions are its options class's fields (plus the device's
    own options), so a new option cannot be described and forgotten by the manifest's check (or the reverse)."""
    typed_by_runner = builtin_runner_options()
    for name, typed in typed_by_runner.items():
        runner = RUNNERS.get(name)
        declared = set(runner.options)
        device_only = {k for k in declared if device_only_hint(name, k) is not None}
        assert device_only >= set(runner.device_options), name  # declared once, on the runner: each is refused
        assert {f for f in typed.__dataclass_fields__} == declared - device_only, name
        assert all(runner.options.values()), name  # every option described (the CLI and doctor print them)
    assert set(typed_by_runner) == set(RUNNERS.names())


def test_a_plugin_runner_brings_its_own_option_types(tmp_path: Path) -> None:
    """A runner registered from outside edgekit declares its options the same way; the manifest check reads them
    through the registry (no map in edgekit to extend)."""
    from dataclasses import dataclass

    from edge.backends.options import DeviceOption
    from edge.backends.runner import Runner
    from edge.base.typedjson import spec

    @dataclass(frozen=True)
    class EchoOptions:
        gain: int = spec(1, ge=1, le=8, doc="how loud")

    class EchoRunner(Runner):
        name = "echo-plugin"
        formats = ("onnx",)
        options_class = EchoOptions

        def infer(self, feeds: Any) -> Any:  # pragma: no cover - never run
            return dict(feeds)

    class EchoDeviceRunner(Runner):
        name = "echo-device-plugin"
        formats = ("onnx",)
        options_class = EchoOptions
        device_options = {"socket": DeviceOption("the echo socket", env="ECHO_SOCKET", example="/run/echo")}

        def infer(self, feeds: Any) -> Any:  # pragma: no cover - never run
            return dict(feeds)

    assert dict(EchoRunner.options) == {"gain": "how loud"}
    assert dict(EchoDeviceRunner.options) == {"gain": "how loud", "socket": "the echo socket"}
    RUNNERS.register(EchoRunner)
    RUNNERS.register(EchoDeviceRunner)
    try:
        check_runner(read(RunnerSpec, {"name": "echo-plugin", "options": {"gain": 4}}))
        with pytest.raises(Invalid, match="runner.options.gain"):
            check_runner(read(RunnerSpec, {"name": "echo-plugin", "options": {"gain": 9}}))
        # its device-only option (no path-like name) is refused in a manifest with the hint it declares
        assert device_only_hint("echo-device-plugin", "socket") == (
            "set ECHO_SOCKET on the device, or the agent's --runner-option socket=/run/echo"
        )
        with pytest.raises(Invalid, match="set ECHO_SOCKET on the device"):
            check_runner(read(RunnerSpec, {"name": "echo-device-plugin", "options": {"socket": "x"}}))
        assert "echo-plugin" not in builtin_runner_options()  # the published schema is edgekit's own
    finally:
        RUNNERS.unregister("echo-plugin")
        RUNNERS.unregister("echo-device-plugin")


def test_every_shipped_profile_makes_valid_runner_options() -> None:
    for profile in load_targets().values():
        check_runner(read(RunnerSpec, {"name": profile.runner, "options": dict(profile.runtime_options)}))
        if profile.llm is not None:
            check_runner(read(RunnerSpec, {"name": profile.llm.runner, "options": dict(profile.llm.options)}))


def _refused(bundle_dir: Path, text: str, *needles: str) -> str:
    (bundle_dir / "manifest.json").write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError) as e:
        Bundle.open(bundle_dir, verify=False)
    line = str(e.value)
    assert "\n" not in line and "manifest.json" in line
    for n in needles:
        assert n in line, line
    return line


def test_limits_are_one_line_each(manifest: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    _, m = manifest
    d = tmp_path / "b"
    d.mkdir()
    text = json.dumps(m)
    _refused(d, text[:-1] + ', "build_host": ' + " " * MAX_BYTES + "null}", "larger than 1024 KiB")
    _refused(d, text.replace('"calibration": null', '"calibration": ' + "[" * 10000 + "]" * 10000), "nested deeper")
    _refused(
        d,
        text.replace('"calibration": null', '"calibration": ' + '{"a": ' * 20 + "1" + "}" * 20),
        "field calibration.a.a.a.a.a.a.a.a.a",
        "nested deeper than 8",
    )
    _refused(d, text[:-1] + ', "bundle_id": "other"}', "duplicate key")
    _refused(d, text.replace('"scale": 0.00392156862745098', '"scale": NaN'), "NaN")
    _refused(
        d, text.replace('"scale": 0.00392156862745098', '"scale": Infinity'), "field preprocess.scale: must be a finite"
    )
    _refused(d, text.replace('"pad_value": 114', '"pad_value": ' + "9" * 5000), "not valid JSON")
    _refused(d, text.replace('"pad_value": 114', '"pad_value": 1e400'), "field preprocess.pad_value")
    _refused(d, text.replace('"opset": 17', '"opset": ' + "9" * 300), "field source.opset: must be between 1 and 1000")
    _refused(d, text.replace('"bytes": ', '"bytes": -', 1), "field artifacts[0].bytes")
    _refused(d, text.replace('"schema_version": 1', '"schema_version": 2'), "has schema 2; this edgekit reads 1")
    (d / "manifest.json").write_bytes(b'{"schema_version": 1, "bundle_id": "\xff"}')
    with pytest.raises(ManifestError, match="not UTF-8"):
        Bundle.open(d)
    _refused(d, text.replace('"tiny-x86-cpu-fp32-', '"x\\u0000y-'), "field bundle_id")
    _refused(d, json.dumps({**m, "artifacts": [m["artifacts"][0]] * 2}), "artifacts[1].path", "listed twice")
    _refused(
        d, json.dumps({**m, "primary_artifact": "other.onnx"}), "field primary_artifact", "not one of the artifacts"
    )
    _refused(
        d, json.dumps({**m, "parity": {**m["parity"], "passed": None}}), "field parity.passed: must be true or false"
    )
    _refused(d, json.dumps({**m, "parity": {**m["parity"], "precision": "int8"}}), "field parity.precision")
    _refused(d, json.dumps({**m, "tuned": {"overlay_sha256": "not a hash"}}), "field tuned.overlay_sha256")
    _refused(
        d,
        json.dumps(
            {
                **m,
                "tuned": {
                    "overlay_sha256": "ab" * 32,
                    "tuned_on": {"os": "linux", "arch": "x86_64", "cpu": "evil\u001b[2J"},
                },
            }
        ),
        "field tuned.tuned_on.cpu",
    )
    _refused(
        d, json.dumps({**m, "tuned": {"overlay_sha256": "ab" * 32, "objective": "fastest"}}), "field tuned.objective"
    )


@pytest.mark.parametrize(
    "runner,key,value",
    [
        ("litert", "edgetpu_library", "/tmp/libevil.so"),
        ("litert", "edgetpu_library", "libedgetpu.so.1"),
        ("tensorrt", "engine_cache_dir", "/tmp/engines"),
        ("onnxruntime", "custom_ops_library", "libops.so"),  # any runner, any option named like a path
        ("some-plugin", "compiler_path", "cc"),
    ],
)
def test_a_manifest_names_no_library_path_or_command(
    manifest: tuple[Path, dict[str, Any]], tmp_path: Path, runner: str, key: str, value: str
) -> None:
    _, m = manifest
    (tmp_path / "b").mkdir()
    doc = {**m, "runner": {"name": runner, "options": {key: value}}}
    line = _refused(tmp_path / "b", json.dumps(doc), f"field runner.options.{key}", "never a bundle")
    hint = device_only_hint(runner, key)
    assert hint is not None and hint.split(",")[0] in line  # says where it belongs
    if runner in ("litert", "tensorrt"):  # the runner's own declaration: the environment variable it reads
        assert "set EDGEKIT_" in line


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"providers": ["/tmp/libevil.so"]}, "runner.options.providers[0]"),
        ({"providers": "CPUExecutionProvider"}, "runner.options.providers: must be an array"),
        ({"intra_op_num_threads": "2; rm -rf /"}, "runner.options.intra_op_num_threads"),
        ({"intra_op_num_threads": -3}, "runner.options.intra_op_num_threads: must be between 0 and 4096"),
        ({"intra_op_num_threads": True}, "runner.options.intra_op_num_threads: must be an integer"),
        ({"graph_optimization_level": "max"}, "runner.options.graph_optimization_level: must be one of"),
        ({"log_level": 3}, "runner.options.log_level: runner 'onnxruntime' takes no such option"),
    ],
)
def test_runner_options_are_typed(
    manifest: tuple[Path, dict[str, Any]], tmp_path: Path, options: dict[str, Any], needle: str
) -> None:
    _, m = manifest
    (tmp_path / "b").mkdir()
    _refused(tmp_path / "b", json.dumps({**m, "runner": {"name": "onnxruntime", "options": options}}), needle)


def test_an_unknown_runner_is_refused_at_open(manifest: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    _, m = manifest
    (tmp_path / "b").mkdir()
    _refused(
        tmp_path / "b",
        json.dumps({**m, "runner": {"name": "warp-drive", "options": {}}}),
        "field runner.name",
        "no usable runner",
    )


# -- the schema and the reader agree on mutated manifests ------------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**60), 2**60),
    st.sampled_from([2**53 + 1, 10**300, 2.0, 1e300]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["..", "a/b", "x" * 300, "CPU", "edgetpu", "onnx->onnx", "0" * 64]),
)
_value = st.recursive(
    _leaf, lambda i: st.lists(i, max_size=3) | st.dictionaries(st.text(max_size=6), i, max_size=3), max_leaves=5
)


def _structural(doc: Any) -> tuple[bool, str]:
    """What the schema can express: types, ranges, patterns, and per-runner option types."""
    try:
        typed = read(Manifest, doc)
        options_class = builtin_runner_options().get(typed.runner.name)
        if options_class is not None:
            read(options_class, to_json(typed.runner.options), "runner.options")
        return True, ""
    except Invalid as e:
        return False, str(e)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_schema_and_reader_agree(manifest: tuple[Path, dict[str, Any]], data: st.DataObject) -> None:
    doc = copy.deepcopy(manifest[1])
    paths = _paths(doc)[1:]
    path = paths[data.draw(st.integers(0, len(paths) - 1))]
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if data.draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(_value)
    try:
        doc = loads_strict(json.dumps(doc), max_depth=32)
    except Invalid:
        return
    ours, why = _structural(doc)
    theirs = next(iter(_validator().iter_errors(doc)), None)
    if "nested deeper than" in why:  # free-form depth: beyond what JSON Schema can say
        return
    assert ours == (theirs is None), f"edgekit: {why or 'valid'}; jsonschema: {theirs.message if theirs else 'valid'}"


def test_a_converters_long_notes_fit_the_manifest() -> None:
    """U^2-Net-p (rembg) for coral-edgetpu: onnx2tf's layout note lists each transposed input and output with its
    int8 scale, 1,098 characters for its 8 tensors, and the bundle's own manifest failed its schema ("field
    chain[0].notes[0]: must be 0 to 1024 characters long ... do not edit manifests by hand"). Every step's notes
    are fitted to the schema where the manifest is written: a long one cut at an entry, the extra ones counted."""
    from edge.bundle.fields import MAX_NOTES, TEXT, fit_notes

    entry = "1959 NCHW [1, 1, 320, 320] -> NHWC [1, 320, 320, 1] (the runner transposes), int8 scale 0.00390625 zero point -128"
    layout = "layout: " + "; ".join(f"{i} {entry}" for i in range(9))
    assert len(layout) > TEXT["max_len"]
    [fitted] = fit_notes([layout])
    assert len(fitted) <= TEXT["max_len"] and fitted.endswith("more characters not kept)"), fitted
    assert fitted.startswith(layout[: fitted.index("; ...")]) and "zero point -128; ..." in fitted  # cut at an entry
    many = fit_notes([f"note {i}" for i in range(100)])
    assert len(many) == MAX_NOTES and many[-1] == "... 37 more notes not kept" and many[:2] == ["note 0", "note 1"]
    assert fit_notes(["short"]) == ["short"]
