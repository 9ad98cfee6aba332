from __future__ import annotations

from pathlib import Path

import pytest

from edge.backends.converter import CONVERTERS
from edge.backends.runner import RUNNERS
from edge.capabilities import Host
from edge.errors import PrecisionError, TargetError
from edge.targets import ENV_VAR, builtin_dir, get_target, load_targets, parse_profile, same_device_class

SHIPPED = {
    "jetson-orin",
    "apple-ane",
    "intel-igpu",
    "arm-xnnpack",
    "coral-edgetpu",
    "x86-cpu",
    "ethos-u55",
    "ethos-u65",
    "rockchip-rk3588",
    "rockchip-rk3576",
    "rockchip-rk3566",
    "executorch-xnnpack",
}

VALID = """
schema_version = 1
name = "{name}"
title = "Test board"
hardware = "a test board"
default_precision = "fp32"
precisions = ["fp32", "int8"]
frame_budget_ms = 33.3

[convert]
chain = ["onnx->onnx"]
os = ["linux", "darwin", "windows"]
arch = ["x86_64", "aarch64"]

[run]
runner = "onnxruntime"
os = ["linux", "darwin", "windows"]
arch = ["x86_64", "aarch64"]
device_arch = ["aarch64"]

[run.options]
intra_op_num_threads = 1
"""


def test_every_shipped_profile_loads_and_names_known_backends() -> None:
    profiles = load_targets()
    assert SHIPPED <= set(profiles)
    converters_used, runners_used = set(), set()
    for p in profiles.values():
        assert p.default_precision in p.precisions
        converters_used |= {step.converter for step in p.chain}
        runners_used.add(p.runner)
        if p.llm is not None:
            runners_used.add(p.llm.runner)
            assert p.llm.default_precision in p.llm.precisions
        # options given to converters must be ones those converters take
        for name, opts in p.convert_options.items():
            assert name in {step.converter for step in p.chain}, (p.name, name)
            CONVERTERS.get(name).check_options(opts)
    # every backend a shipped profile names is registered (no profile may name one that is not there yet),
    # and the profiles do name some: an empty set would make this check pass vacuously
    assert converters_used and runners_used
    assert converters_used - set(CONVERTERS.names()) == set()
    assert runners_used - set(RUNNERS.names()) == set()
    assert {
        "onnx->coreml",
        "onnx->tflite",
        "onnxruntime",
        "openvino",
        "tensorrt",
        "llama.cpp",
    } <= converters_used | runners_used, (converters_used, runners_used)


def test_runtime_options_are_accepted_by_the_runner() -> None:
    for p in load_targets().values():
        if p.runner in RUNNERS:
            cls = RUNNERS.get(p.runner)
            assert set(p.runtime_options) <= set(cls.options), (p.name, set(p.runtime_options) - set(cls.options))
        if p.llm is not None:
            cls = RUNNERS.get(p.llm.runner)
            assert set(p.llm.options) <= set(cls.options), (p.name, set(p.llm.options) - set(cls.options))


def test_unknown_target_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="did you mean 'intel-igpu'"):
        get_target("intel-gpu")


def test_precision_not_allowed_lists_allowed() -> None:
    with pytest.raises(PrecisionError, match="allowed: int8"):
        get_target("coral-edgetpu").check_precision("fp16")


def test_malformed_profile_reports_file_key_and_every_problem(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text(
        VALID.format(name="board")
        .replace("frame_budget_ms = 33.3", 'frame_budget_ms = "fast"')
        .replace('title = "Test board"', 'title = "Test board"\nhardwre = "typo"')
    )
    with pytest.raises(TargetError) as e:
        parse_profile(f)
    msg = str(e.value)
    assert str(f) in msg
    assert "frame_budget_ms: expected int/float" in msg
    assert "hardwre: unknown key; did you mean 'hardware'?" in msg


def test_semantic_problems_reported_together(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text(
        VALID.format(name="other")
        .replace('default_precision = "fp32"', 'default_precision = "fp8"')
        .replace('precisions = ["fp32", "int8"]', 'precisions = ["fp32", "in8"]')
    )
    with pytest.raises(TargetError) as e:
        parse_profile(f)
    msg = str(e.value)
    assert "name: 'other' must match the file name 'board'" in msg
    assert "unknown precision 'in8'; did you mean 'int8'?" in msg
    assert "default_precision: 'fp8' is not in precisions" in msg


def test_not_toml_is_a_target_error(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text("this is [not toml")
    with pytest.raises(TargetError, match="not valid TOML"):
        parse_profile(f)


def test_user_directory_adds_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "board.toml").write_text(VALID.format(name="board"))
    (tmp_path / "x86-cpu.toml").write_text(VALID.format(name="x86-cpu").replace("Test board", "My x86"))
    profiles = load_targets([tmp_path])
    assert profiles["board"].frame_budget_ms == 33.3
    assert profiles["x86-cpu"].title == "My x86" and profiles["x86-cpu"].path == tmp_path / "x86-cpu.toml"
    assert profiles["intel-igpu"].path.parent == builtin_dir()
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert get_target("board").title == "Test board"


def test_missing_targets_dir_is_reported(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="does not exist"):
        load_targets([tmp_path / "nope"])


def test_device_class_defaults_and_is_checked_all_at_once(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text(VALID.format(name="board").replace('device_arch = ["aarch64"]\n', ""))
    # a profile written before device_arch existed keeps working: every run architecture is its device class
    assert parse_profile(f).device_class.arch == tuple(parse_profile(f).run_place.arch)
    f.write_text(
        VALID.format(name="board").replace(
            'device_arch = ["aarch64"]',
            'device_arch = ["arm64", "aarch46", "armv7l"]\ndevice_os = ["linux", "android"]\ndevice_platform = "jetsn"',
        )
    )
    with pytest.raises(TargetError) as e:
        parse_profile(f)
    msg = str(e.value)
    assert "run.device_arch: unknown architecture 'aarch46'; did you mean 'aarch64'?" in msg
    assert "run.device_arch: ['armv7l'] not in run.arch" in msg  # the runner must run on the devices themselves
    assert "run.device_os: ['android'] not in run.os" in msg
    assert "run.device_platform: unknown platform 'jetsn'; did you mean 'jetson'?" in msg
    f.write_text(VALID.format(name="board").replace('device_arch = ["aarch64"]', 'device_arch = ["arm64"]'))
    dc = parse_profile(f).device_class
    assert dc.arch == ("aarch64",) and dc.os == ("linux", "darwin", "windows") and dc.platform is None


X86 = Host("linux", "x86_64", nvidia_gpu=False, jetson=False)
PI = Host("linux", "aarch64", nvidia_gpu=False, jetson=False)
MAC = Host("darwin", "aarch64", nvidia_gpu=False, jetson=False)
GPU_BOX = Host("linux", "aarch64", nvidia_gpu=True, jetson=False)
ORIN = Host("linux", "aarch64", nvidia_gpu=True, jetson=True)


@pytest.mark.parametrize(
    "target,host,fallback,same",
    [
        ("arm-xnnpack", X86, None, False),  # LiteRT runs on the x86 build host, but that is not a Pi
        ("arm-xnnpack", MAC, None, False),
        ("arm-xnnpack", PI, None, True),
        ("arm-xnnpack", PI, "CPU fallback: XNNPack took none of the ops", False),
        ("x86-cpu", X86, None, True),
        ("x86-cpu", PI, None, False),
        ("intel-igpu", X86, None, True),
        ("intel-igpu", X86, "GPU not available: ran on CPU", False),  # the iGPU is the device, the CPU is not
        ("jetson-orin", X86, None, False),
        ("jetson-orin", GPU_BOX, None, False),  # an aarch64 server with an NVIDIA GPU is not a Jetson
        ("jetson-orin", ORIN, None, True),
        ("coral-edgetpu", X86, None, True),  # the Edge TPU (USB/PCIe) reached: the device class
        ("coral-edgetpu", PI, "CPU fallback: libedgetpu.so.1 could not be loaded", False),
        ("apple-ane", X86, None, False),
        ("apple-ane", MAC, None, True),
    ],
)
def test_same_device_class(target: str, host: Host, fallback: str | None, same: bool) -> None:
    ok, why = same_device_class(get_target(target), host, {"fallback": fallback})
    assert ok is same
    assert why.startswith("same device class: " if same else "different device class: ")
    if not same and fallback:
        assert fallback in why
    elif not same:
        assert f"this host is {host.os}/{host.arch}" in why and f"{target}'s devices are" in why
