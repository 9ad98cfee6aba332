"""Runtimes that are not targets (issue #32): their names are refused in one line saying what is missing."""

from __future__ import annotations

import pytest

from edge.errors import TargetError
from edge.targets import NOT_TARGETS, get_target
from tests.support.cli import run_cli


@pytest.mark.parametrize("name", ["qualcomm-npu", "Snapdragon", "mediatek-npu", "nnapi", "tfjs", "tvm"])
def test_not_targets_are_refused_saying_why(name: str) -> None:
    with pytest.raises(TargetError, match=f"{name!r} is not a target: .+"):
        get_target(name)


def test_qualcomm_refusal_names_the_missing_libraries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = run_cli("convert", str(tmp_path / "m.onnx"), "-t", "qualcomm-npu", "-o", str(tmp_path / "b"))
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "libQnnHtp" in lines[0] and "ai-edge-litert-sdk-qualcomm" in lines[0]
    assert "libneuron_adapter" in NOT_TARGETS["mediatek-npu"]


def test_a_user_profile_with_such_a_name_wins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = get_target("x86-cpu")
    assert src.path is not None
    text = src.path.read_text().replace('name = "x86-cpu"', 'name = "qualcomm-npu"')
    (tmp_path / "qualcomm-npu.toml").write_text(text)
    assert get_target("qualcomm-npu", [tmp_path]).name == "qualcomm-npu"
