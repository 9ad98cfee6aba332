"""How many threads a CPU runner takes, and whether they spin, from what shares the machine.

A runtime's own defaults are tuned for an idle benchmark: onnxruntime starts one thread per
physical core whose workers busy-wait between ops (``session.intra_op.allow_spinning``), OpenVINO
pins one thread per core. On an edge device the camera decode, the application and the agent
share those cores, and a spinning pool then fights them: YOLOv8n-320 took 20.3 ms a frame with
onnxruntime's defaults against 10.9 ms on one thread without spin-wait, with another process
taking one of the two cores (issue #25).

The policy, for a runner whose options leave threads at 0 ("auto") and spinning unset:

* the CPUs this process may use (``os.sched_getaffinity``);
* minus what other processes keep busy now on those CPUs: a short sample of their ``/proc/stat`` lines
  less this process's own CPU time over the same window (the 1-minute load average where /proc/stat is not readable;
  it lags a minute behind and counts this process too, so it is only recorded otherwise);
* minus what the caller's other threads take (``reserve_cpus``: the video pipeline's decode,
  pre- and post-processing stages, given by ``edge.video``);
* rounded to whole threads, at least 1; spin-wait off (a sleeping pool gives the core back to the
  rest of the device at once; with one thread there is no pool to spin).

An option the user, the target profile or a tuned overlay set explicitly always wins; the plan
records which value came from where and why (``RunnerInfo.details["threads_policy"]``), so
``edgekit bench``/``run`` reports and manifests say what was chosen.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from edge.errors import EdgeError

#: CPU one pipeline stage beside inference is given, in cores; ``edge.video`` reserves it per stage (decode,
#: pre- and post-processing: 0.15 in all). Measured (CPU time a frame, AMD EPYC): a synthetic 640x480 frame
#: 0.03 ms, its letterbox to 320x320 0.21 ms, YOLOv8 NMS 0.07 ms: 0.04 core for all three at 120 fps; an H.264
#: decode of a few ms is 0.1-0.2 core at 60 fps. It only moves the rounding of the thread count: 0.15 core per
#: stage (0.45) left 2 CPUs with 0.2 core of background load one thread, and YOLOv8n-320 then missed 120 fps.
PIPELINE_STAGE_CPUS = 0.05
#: below this many cores busy elsewhere (and nothing reserved), the CPUs count as not shared
SHARED_THRESHOLD = 0.25
SAMPLE_S = 0.1  # the /proc/stat window: 10 scheduler ticks at USER_HZ 100
_CACHE_S = 2.0  # runners opened together (workers, a parity run) share one sample

_last: tuple[float, CpuLoad] | None = None


@dataclass(frozen=True)
class CpuLoad:
    """The CPUs this process may use and how busy other processes keep them."""

    cpus: int  # os.sched_getaffinity
    others: float  # cores other processes kept busy over the sample (or the load average's estimate)
    load_1m: float | None  # os.getloadavg()[0], for the record
    method: str  # "sampled /proc/stat over 100 ms" | "1-min load average" | "unknown"


@dataclass(frozen=True)
class ThreadPlan:
    threads: int
    spinning: bool
    threads_from: str  # "option" (user, profile or tuned overlay) | "policy"
    spinning_from: str
    shared: bool  # something else takes a share of the CPUs (other processes or the caller's own stages)
    reason: str
    cpus: int
    others: float
    reserve: float
    load_1m: float | None
    method: str

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["others"] = round(self.others, 2)
        return d


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_proc_stat(text: str, cpus: frozenset[int] | None = None) -> tuple[int, int] | None:
    """(busy ticks, total ticks) of /proc/stat's text, summed over ``cpus`` (their ``cpuN`` lines; None: the
    all-CPU ``cpu`` line). Idle and iowait are idle; the rest (user, nice, system, irq, softirq, steal) busy."""
    busy = total = 0
    seen = False
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu"):
            continue
        if cpus is None and name != "cpu":
            continue
        if cpus is not None and (name == "cpu" or not name[3:].isdigit() or int(name[3:]) not in cpus):
            continue
        try:
            ticks = [int(x) for x in rest.split()[:8]]
        except ValueError:
            return None
        if len(ticks) < 4:
            return None
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        busy += sum(ticks) - idle
        total += sum(ticks)
        seen = True
    return (busy, total) if seen else None


def _proc_stat_busy(cpus: frozenset[int] | None) -> tuple[int, int] | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return parse_proc_stat(f.read(), cpus)
    except OSError:
        return None


def _own_ticks() -> int | None:
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(parts[11]) + int(parts[12])  # utime, stime (fields 14, 15; the 3rd after ")" is index 0)


def measure_load(sample_s: float = SAMPLE_S) -> CpuLoad:
    """What other processes take of this process's CPUs now (see the module's docstring)."""
    try:
        mine: frozenset[int] | None = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = None
    cpus = len(mine) if mine else usable_cpus()
    try:
        load_1m: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load_1m = None
    a, own_a = _proc_stat_busy(mine), _own_ticks()
    if a is not None and own_a is not None:
        time.sleep(sample_s)
        b, own_b = _proc_stat_busy(mine), _own_ticks()
        if b is not None and own_b is not None and b[1] > a[1]:
            # this process's own ticks may have run on other CPUs too: subtracting them all errs towards idle
            busy = max(0, (b[0] - a[0]) - (own_b - own_a))
            others = min(float(cpus), busy / (b[1] - a[1]) * cpus)  # ticks over this process's CPUs -> cores
            return CpuLoad(cpus, others, load_1m, f"sampled /proc/stat over {sample_s * 1000:.0f} ms")
    if load_1m is not None:
        return CpuLoad(cpus, min(float(cpus), load_1m), load_1m, "1-min load average")
    return CpuLoad(cpus, 0.0, None, "unknown")


def current_load() -> CpuLoad:
    """``measure_load()``, reused for runners opened within two seconds of each other."""
    global _last
    now = time.monotonic()
    if _last is not None and now - _last[0] < _CACHE_S:
        return _last[1]
    load = measure_load()
    _last = (time.monotonic(), load)
    return load


def reserve_option(runner: str, options: Mapping[str, Any]) -> float:
    """The ``reserve_cpus`` runner option, checked: cores the caller's other threads take (default 0)."""
    value = options.get("reserve_cpus", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 4096:
        raise EdgeError(f"runner {runner!r}: reserve_cpus must be a number of cores from 0 to 4096, got {value!r}")
    return float(value)


def plan_threads(
    threads: int | None,
    spinning: bool | None,
    *,
    reserve: float = 0.0,
    load: CpuLoad | None = None,
    spin_option: bool = True,
) -> ThreadPlan:
    """Threads and spin-wait for one runner. ``threads`` 0/None and ``spinning`` None are the policy's to choose;
    anything else was set explicitly and is kept as it is. ``spin_option`` False: the runtime has no spin-wait
    switch (OpenVINO, LiteRT), and the plan says so."""
    load = load or current_load()
    others = load.others
    shared = reserve > 0 or others >= SHARED_THRESHOLD  # the caller's own stages, or other processes
    free = load.cpus - others - reserve
    auto = max(1, min(load.cpus, int(free + 0.5)))
    parts = [f"{load.cpus} CPU(s) for this process", f"{others:.2f} busy elsewhere ({load.method})"]
    if reserve:
        parts.append(f"{reserve:.2f} reserved for this process's other stages")
    why = "; ".join(parts)
    if threads:
        threads_from, n = "option", int(threads)
        why += f"; threads {n} as set (the policy would take {auto})"
    else:
        threads_from, n = "policy", auto
        why += f" -> {n} thread(s)"
    if not spin_option:
        spinning_from, spin = "runtime", False
        why += "; no spin-wait option in this runtime"
    elif spinning is not None:
        spinning_from, spin = "option", bool(spinning)
        why += f"; spin-wait {'on' if spin else 'off'} as set"
    else:
        spinning_from, spin = "policy", False
        why += "; spin-wait off (a waiting pool gives its core back to the rest of the device)"
    return ThreadPlan(
        threads=n,
        spinning=spin,
        threads_from=threads_from,
        spinning_from=spinning_from,
        shared=shared,
        reason=why,
        cpus=load.cpus,
        others=others,
        reserve=reserve,
        load_1m=load.load_1m,
        method=load.method,
    )
