"""The emulated aarch64 check's progress lines and its bound (issue #34): cheap, no guest (the guest runs in
tests/verify/test_isa_aarch64.py)."""

from __future__ import annotations

import pytest

from edge.errors import EdgeError
from edge.verify import isa, isa_guest


def test_the_guest_progress_line_parses_back(capsys: pytest.CaptureFixture[str]) -> None:
    isa_guest.progress(0, 16)
    isa_guest.progress(3, 16)
    lines = capsys.readouterr().err.splitlines()
    assert [isa.parse_progress(ln) for ln in lines] == [(0, 16), (3, 16)]
    for junk in ("", "Traceback (most recent call last):", isa_guest.PROGRESS + "{", isa_guest.PROGRESS + "[1]"):
        assert isa.parse_progress(junk) is None
    assert isa.parse_progress(isa_guest.PROGRESS + '{"done": 5, "of": 4}') is None
    assert isa.parse_progress(isa_guest.PROGRESS + '{"done": true, "of": 4}') is None


def test_the_bound_follows_the_measured_samples() -> None:
    # nothing measured yet: only the cap
    assert isa.run_bound(None, 0, 0.0, 16, 1800.0) == 1800.0
    assert isa.run_bound(40.0, 0, 40.0, 16, 1800.0) == 1800.0
    # start-up 40 s, 2 samples in 20 s (10 s each): 40 + 2 x 10 x 16 + 60 = 420 s
    assert isa.run_bound(40.0, 2, 60.0, 16, 1800.0) == pytest.approx(40 + isa.BOUND_FACTOR * 10 * 16 + 60)
    # a heavy model (60 s a sample: 100 + 2 x 60 x 16 + 60 = 2080 s): the cap still holds
    assert isa.run_bound(100.0, 1, 160.0, 16, 1800.0) == 1800.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_watch_says_each_sample_and_stops_in_one_line_past_the_bound() -> None:
    said: list[str] = []
    clock = Clock()
    watch = isa.GuestWatch(4, 1800.0, said.append, clock)
    clock.t = 30.0
    watch("some warning from the runtime")
    watch(isa_guest.PROGRESS + '{"done": 0, "of": 4}')
    clock.t = 40.0
    watch(isa_guest.PROGRESS + '{"done": 1, "of": 4}')
    assert said == [
        "emulated aarch64 check: started in 30 s, 4 samples to run",
        "emulated aarch64 check: sample 1 of 4, ~30 s left (emulation, not a speed figure)",
    ]
    clock.t = 41.0
    watch(isa_guest.PROGRESS + '{"done": 2, "of": 4}')  # 1 s after the last line said: not said
    clock.t = 133.0
    watch(None)  # inside the bound: start-up 30 s + 2 x 5.5 s per sample x 4 + 60 s = 134 s
    clock.t += 2
    with pytest.raises(EdgeError) as e:
        watch(None)
    msg = str(e.value)
    assert len(said) == 2 and "\n" not in msg and "2 of 4 samples done" in msg
    assert "past its bound of 134 s" in msg  # 30 + 2 x 5.5 s per sample x 4 + 60
    assert "--parity-samples" in msg and "--no-isa-check" in msg


def test_the_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEKIT_ISA_TIMEOUT_S", raising=False)
    assert isa.isa_timeout_s() == isa.ISA_TIMEOUT_S
    monkeypatch.setenv("EDGEKIT_ISA_TIMEOUT_S", "90")
    assert isa.isa_timeout_s() == 90.0
    watch = isa.GuestWatch(16, isa.isa_timeout_s(), lambda _m: None, Clock())
    watch.clock.t = 91.0  # type: ignore[attr-defined]
    with pytest.raises(EdgeError, match=r"0 of 16 samples done: past its cap of 90 s"):
        watch(None)
    monkeypatch.setenv("EDGEKIT_ISA_TIMEOUT_S", "soon")
    with pytest.raises(EdgeError, match="not a number of seconds"):
        isa.isa_timeout_s()
