"""A converter's options declared once, typed (``options_class``, as a runner's are): the names and descriptions,
the check of a profile's values and the defaults come from one dataclass. OpenVINO's converters read theirs from it
(they read a raw dict with five hand checks before)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edge.backends.converter import ConversionRequest
from edge.backends.openvino.convert import OnnxToOpenVINO, OpenVINOConvertOptions, convert_options
from edge.backends.openvino.from_tflite import TFLiteToOpenVINO
from edge.errors import ConversionError
from edge.spec import IOSpec


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
    from edge.tune.space import SPACES

    cls = {"onnxruntime": OnnxRuntimeOptions, "openvino": OpenVINOOptions, "litert": LiteRTOptions}[runner]
    space = SPACES[runner]
    assert dict(space.options) == search_values(cls, first=space.threads_option)
    assert next(iter(space.options)) == space.threads_option
    for name, values in space.options.items():
        for v in values:
            read(cls, {name: v}, "options")  # every value a trial would set passes the option's own rule
