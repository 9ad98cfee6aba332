"""A converter's options declared once, typed (``options_class``, as a runner's are): the names and descriptions,
the check of a profile's values and the defaults come from one dataclass. Every registered converter declares one and
reads its options through it (before: OpenVINO's alone; the others read a raw dict, 48 reads and their hand checks)."""

from __future__ import annotations

import dataclasses
import importlib
import typing
from pathlib import Path
from typing import Any

import pytest
import tomllib

from edge.backends.converter import ConversionRequest, Converter
from edge.backends.openvino.convert import OnnxToOpenVINO, OpenVINOConvertOptions, convert_options
from edge.backends.openvino.from_tflite import TFLiteToOpenVINO
from edge.backends.options import option_docs
from edge.errors import ConversionError
from edge.spec import IOSpec
from edge.targets import load_targets

REPO = Path(__file__).resolve().parents[2]


def _declared_converters() -> dict[str, type[Converter]]:
    """Every converter pyproject.toml registers (the entry points a built wheel carries), loaded from its own
    declaration: a stale editable install's metadata cannot hide one."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out: dict[str, type[Converter]] = {}
    for name, target in project["entry-points"]["edgekit.converters"].items():
        module, _, attr = target.partition(":")
        out[name] = getattr(importlib.import_module(module), attr)
    return out


CONVERTER_CLASSES = _declared_converters()


def _request(**options: object) -> ConversionRequest:
    return ConversionRequest(Path("m.onnx"), Path("."), "int8", IOSpec(inputs=(), outputs=()), options=options)


def test_the_options_come_from_the_declaration() -> None:
    names = [f.name for f in dataclasses.fields(OpenVINOConvertOptions)]
    assert list(OnnxToOpenVINO.options) == names and all(OnnxToOpenVINO.options.values())
    assert list(TFLiteToOpenVINO.options) == [n for n in names if n.startswith("nncf_")]


def test_defaults_and_words_in_any_case() -> None:
    assert convert_options(_request()) == OpenVINOConvertOptions()
    opts = convert_options(_request(nncf_preset="Mixed", nncf_overflow_fix="FIRST_LAYER", nncf_subset_size=8))
    assert (opts.nncf_preset, opts.nncf_overflow_fix, opts.nncf_subset_size) == ("mixed", "first_layer", 8)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"nncf_preset": "fast"}, "option nncf_preset"),
        ({"nncf_subset_size": 0}, "option nncf_subset_size"),
        ({"nncf_subset_size": "8"}, "option nncf_subset_size"),
        ({"mixed_precision_trials": -1}, "option mixed_precision_trials"),
        ({"mixed_precision": "on"}, "option mixed_precision"),
        ({"nncf_presets": "mixed"}, "nncf_presets"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_converter_and_option(options: dict, needle: str) -> None:
    with pytest.raises(ConversionError) as e:
        convert_options(_request(**options))
    assert "onnx->openvino-ir" in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)


# -- the values the tuner tries live on the runners' option fields (spec(search=...)), not in a table of its own --


@pytest.mark.parametrize("runner", ["onnxruntime", "openvino", "litert"])
def test_the_tuner_tries_what_the_option_fields_declare_and_each_value_is_valid(runner: str) -> None:
    from edge.backends.litert.format import LiteRTOptions
    from edge.backends.onnxruntime.format import OnnxRuntimeOptions
    from edge.backends.openvino.format import OpenVINOOptions
    from edge.backends.options import search_values
    from edge.base.typedjson import read
    from edge.tune.space import runner_space

    cls = {"onnxruntime": OnnxRuntimeOptions, "openvino": OpenVINOOptions, "litert": LiteRTOptions}[runner]
    space = runner_space(runner)
    assert space is not None and space.options_class is cls
    assert dict(space.options) == search_values(cls, first=space.threads_option)
    assert next(iter(space.options)) == space.threads_option
    for name, values in space.options.items():
        for v in values:
            read(cls, {name: v}, "options")  # every value a trial would set passes the option's own rule


# -- every converter: options declared once, typed; a wrong name or value is one line naming the converter --


def test_each_declared_converter_is_registered_under_its_own_name() -> None:
    """pyproject's entry points, not the registry: an editable install's metadata can predate a new converter."""
    assert len(CONVERTER_CLASSES) >= 13
    assert all(cls.name == name for name, cls in CONVERTER_CLASSES.items())


@pytest.mark.parametrize("name", sorted(CONVERTER_CLASSES))
def test_every_converter_declares_its_options_typed(name: str) -> None:
    cls = CONVERTER_CLASSES[name]
    typed = cls.options_class
    assert typed is not None and dataclasses.is_dataclass(typed), f"{name} declares no options_class"
    assert typed.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert dict(cls.options) == option_docs(typed)  # names and descriptions come from the declaration
    assert cls.read_options({}) == typed()  # every option has its default


def _typo(name: str) -> str:
    return name[:-1] if len(name) > 3 else name + "x"


@pytest.mark.parametrize("name", sorted(CONVERTER_CLASSES))
def test_an_unknown_option_is_one_line_naming_the_converter_with_did_you_mean(name: str) -> None:
    cls = CONVERTER_CLASSES[name]
    known = list(cls.options)
    given = _typo(known[0]) if known else "opset"
    with pytest.raises(ConversionError) as e:
        cls.read_options({given: 1})
    text = str(e.value)
    assert "\n" not in text and f"converter {name!r}" in text and repr(given) in text, text
    if known:
        assert f"did you mean {known[0]!r}" in text, text
    assert f"it takes: {', '.join(known) or 'none'}" in text, text


@pytest.mark.parametrize("name", sorted(n for n, c in CONVERTER_CLASSES.items() if c.options))
def test_a_value_of_the_wrong_type_is_one_line_naming_converter_and_option(name: str) -> None:
    cls = CONVERTER_CLASSES[name]
    option = next(iter(cls.options))
    with pytest.raises(ConversionError) as e:
        cls.read_options({option: {"not": "a value"}})
    text = str(e.value)
    assert "\n" not in text and f"converter {name!r}" in text and f"option {option}" in text, text


def test_every_shipped_profile_s_convert_options_read_typed() -> None:
    """What the shipped target profiles give each converter passes its declaration (a TOML value of the wrong type
    would be refused at convert time)."""
    checked = 0
    for target in load_targets().values():
        for converter, options in target.convert_options.items():
            CONVERTER_CLASSES[converter].read_options(options)
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize(
    ("name", "options", "field", "value"),
    [
        ("onnx->onnx", {"calibrate_method": "Entropy", "dynamic_op_types": ["MatMul"]}, "calibrate_method", "entropy"),
        ("onnx->onnx", {"calibration_memory_mb": 512}, "calibration_memory_mb", 512.0),
        ("torch->onnx", {"opset": 13}, "opset", 13),
        ("tflite->edgetpu", {"extra_args": ["--num_segments", "2"]}, "extra_args", ("--num_segments", "2")),
        ("tflite->ethos-u", {"accelerator": "ethos-u65-256"}, "system_config", None),
    ],
)
def test_typed_values_as_the_converters_read_them(name: str, options: dict[str, Any], field: str, value: Any) -> None:
    from edge.backends.onnxruntime.convert import convert_options as onnx_options

    cls = CONVERTER_CLASSES[name]
    request = ConversionRequest(Path("m"), Path("."), "int8", IOSpec(inputs=(), outputs=()), options=options)
    typed = onnx_options(request) if name == "onnx->onnx" else cls.read_options(options)
    assert getattr(typed, field) == value


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("torch->onnx", {"opset": 21}, "option opset must be between 13 and 20, got 21"),
        ("tflite->onnx", {"opset": 12}, "option opset"),
        ("onnx->onnx", {"optimization_level": "all"}, "option optimization_level"),
        ("onnx->onnx", {"calibration_memory_mb": 0}, "option calibration_memory_mb"),
        ("onnx->tflite", {"io_dtype": "int16"}, "option io_dtype"),
        ("onnx->tensorrt-plan", {"dla_core": -2}, "option dla_core"),
        ("tflite->ethos-u", {"memory_mode": "shared"}, "option memory_mode"),
        ("tflite->ethos-u", {"system_config": "../x"}, "option system_config"),
        ("onnx->coreml", {"compute_units": "GPU"}, "option compute_units"),
        ("gguf->gguf", {"allow_requantize": "yes"}, "option allow_requantize"),
    ],
)
def test_an_out_of_range_value_is_refused_before_any_work(name: str, options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConversionError) as e:
        CONVERTER_CLASSES[name].read_options(options)
    assert needle in str(e.value) and f"converter {name!r}" in str(e.value), str(e.value)


def test_ethos_u_s_choices_are_the_format_s() -> None:
    from edge.backends.ethosu.convert import EthosUConvertOptions
    from edge.backends.ethosu.format import MEMORY_MODES, SYSTEMS

    hints = typing.get_type_hints(EthosUConvertOptions)
    assert typing.get_args(hints["accelerator"]) == tuple(SYSTEMS)
    assert typing.get_args(hints["memory_mode"]) == MEMORY_MODES
