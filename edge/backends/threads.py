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

Where the CPUs are not shared (less than ``SHARED_THRESHOLD`` core busy elsewhere, nothing reserved) a runtime
that says what it would pick itself (``RuntimeDefaults``: onnxruntime's one intra-op thread per physical core,
spin-wait on) gets exactly that: its own defaults are tuned for that case, and spin-wait off cost onnxruntime
1.14-1.62x on an idle host (issue #25). Its thread count is kept only where it fits the CPUs this process may
use (onnxruntime counts the machine's cores, not ``sched_getaffinity``'s: under ``taskset``/a cpuset it would
oversubscribe).

A runner that lives long (``edgekit run``, the agent) re-samples the load between two inferences every few
seconds (``LoadWatch``: the /proc/stat ticks since the last look, no sleep) and, when the plan the policy would
make now differs, opens its session again with it (``Recheck``: two looks in a row must agree; a lighter plan --
spin-wait off, fewer threads -- soon, a heavier one only after a long quiet; rebuilds never more than
``REBUILD_SHARE`` of the time; OpenVINO compiles its model again). onnxruntime has no run option that turns spin-wait on or off in an open
session (``session.force_spinning_stop`` only stops it between runs), so the session is re-created.

An option the user, the target profile or a tuned overlay set explicitly always wins; the plan
records which value came from where and why (``RunnerInfo.details["threads_policy"]``), so
``edgekit bench``/``run`` reports and manifests say what was chosen.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

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
RECHECK_S = 2.0  # a long-lived runner's look at the load, between two inferences
CONFIRM = 2  # looks in a row that must want the same new, lighter plan
QUIET_LOOKS = 30  # looks in a row that must want a heavier one (spin-wait on, more threads)
REBUILD_SHARE = 0.01  # re-creating sessions takes at most this share of the time
_CACHE_S = 2.0  # runners opened together (workers, a parity run) share one sample
_MAX_CPU_ENTRIES = 16384  # sysfs entries read for the core count

_last: tuple[float, CpuLoad] | None = None


@dataclass(frozen=True)
class CpuLoad:
    """The CPUs this process may use and how busy other processes keep them."""

    cpus: int  # os.sched_getaffinity
    others: float  # cores other processes kept busy over the sample (or the load average's estimate)
    load_1m: float | None  # os.getloadavg()[0], for the record
    method: str  # "sampled /proc/stat over 100 ms" | "1-min load average" | "unknown"


@dataclass(frozen=True)
class RuntimeDefaults:
    """What a runtime picks itself when given no thread count and no spin-wait setting."""

    threads: int  # the count it takes (onnxruntime: physical cores, all of the machine's)
    spinning: bool
    what: str  # for the reason line: "onnxruntime's own: one thread per physical core, spin-wait on"


@dataclass(frozen=True)
class ThreadPlan:
    threads: int
    spinning: bool
    threads_from: str  # "option" (user, profile or tuned overlay) | "policy" | "default" (the runtime's own)
    spinning_from: str  # the same, or "runtime" (it has no spin-wait switch)
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
    defaults: RuntimeDefaults | None = None,
    shared_threshold: float = SHARED_THRESHOLD,
) -> ThreadPlan:
    """Threads and spin-wait for one runner. ``threads`` 0/None and ``spinning`` None are the policy's to choose;
    anything else was set explicitly and is kept as it is. ``spin_option`` False: the runtime has no spin-wait
    switch (OpenVINO, LiteRT), and the plan says so. ``defaults``: what the runtime picks itself, taken where
    the CPUs are not shared (see the module's docstring). ``shared_threshold``: cores busy elsewhere from which
    the CPUs count as shared (``Recheck`` lowers it for a runner already sharing them: hysteresis)."""
    load = load or current_load()
    others = load.others
    shared = reserve > 0 or others >= shared_threshold  # the caller's own stages, or other processes
    free = load.cpus - others - reserve
    auto = max(1, min(load.cpus, int(free + 0.5)))
    parts = [f"{load.cpus} CPU(s) for this process", f"{others:.2f} busy elsewhere ({load.method})"]
    if reserve:
        parts.append(f"{reserve:.2f} reserved for this process's other stages")
    why = "; ".join(parts)
    own = defaults if defaults is not None and not shared else None
    if own is not None:
        why += f"; not shared -> the runtime's own defaults ({own.what})"
    if threads:
        threads_from, n = "option", int(threads)
        why += f"; threads {n} as set (the policy would take {auto})"
    elif own is not None and own.threads <= load.cpus:
        threads_from, n = "default", own.threads
        why += f" -> {n} thread(s)"
    else:
        threads_from, n = "policy", auto
        if own is not None:
            why += f"; its {own.threads} thread(s) exceed the {load.cpus} CPU(s) this process may use"
        why += f" -> {n} thread(s)"
    if not spin_option:
        spinning_from, spin = "runtime", False
        why += "; no spin-wait option in this runtime"
    elif spinning is not None:
        spinning_from, spin = "option", bool(spinning)
        why += f"; spin-wait {'on' if spin else 'off'} as set"
    elif own is not None:
        spinning_from, spin = "default", own.spinning
        why += f"; spin-wait {'on' if spin else 'off'}"
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


def physical_cores(root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """The machine's physical cores (distinct package and core ids of its online CPUs, from sysfs), whatever this
    process's affinity: what onnxruntime counts for its default thread count. None where sysfs does not say."""
    cores: set[tuple[str, str]] = set()
    try:
        entries = sorted(root.iterdir())[:_MAX_CPU_ENTRIES]
    except OSError:
        return None
    for d in entries:
        if not (d.name.startswith("cpu") and d.name[3:].isdigit()):
            continue
        try:  # an offline CPU has no topology directory
            package = (d / "topology" / "physical_package_id").read_text(encoding="ascii").strip()
            core = (d / "topology" / "core_id").read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        cores.add((package[:16], core[:16]))
    return len(cores) or None


class LoadWatch:
    """What other processes took of this process's CPUs since the last look: two /proc/stat readings taken
    between inferences, seconds apart, so nothing sleeps (``measure_load`` sleeps 100 ms for its window)."""

    def __init__(self) -> None:
        self._last = self._read()

    @property
    def works(self) -> bool:
        return self._last is not None

    @staticmethod
    def _read() -> tuple[float, int, int, int, frozenset[int] | None] | None:
        try:
            mine: frozenset[int] | None = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            mine = None
        ticks, own = _proc_stat_busy(mine), _own_ticks()
        if ticks is None or own is None:
            return None
        return time.monotonic(), ticks[0], ticks[1], own, mine

    def poll(self) -> CpuLoad | None:
        """The load since the last poll (or since this watch was made); None where /proc/stat said nothing new."""
        now = self._read()
        last, self._last = self._last, now if now is not None else self._last
        if last is None or now is None or now[2] <= last[2]:
            return None
        cpus = len(now[4]) if now[4] else usable_cpus()
        busy = max(0, (now[1] - last[1]) - (now[3] - last[3]))  # less this process's own ticks, as measure_load
        others = min(float(cpus), busy / (now[2] - last[2]) * cpus)
        try:
            load_1m: float | None = os.getloadavg()[0]
        except (AttributeError, OSError):
            load_1m = None
        return CpuLoad(cpus, others, load_1m, f"sampled /proc/stat over {now[0] - last[0]:.1f} s")


@dataclass
class Recheck:
    """When a long-lived runner re-creates its session for the plan the load calls for now (pure: the caller
    gives the candidate plans and the clock). A plan that takes less of the CPUs (spin-wait off, fewer threads)
    is urgent: it is taken once ``CONFIRM`` looks in a row want it, at least ``2.5 x every_s`` after the last
    session was made. One that takes more waits for ``QUIET_LOOKS`` looks in a row of quiet. Either waits at
    least the last session's creation time / ``REBUILD_SHARE``, so rebuilds take at most that share of the
    time."""

    every_s: float
    opened_at: float
    cost_s: float  # what creating the current session took
    next_look: float = 0.0
    pending: ThreadPlan | None = None
    seen: int = 0

    def __post_init__(self) -> None:
        self.next_look = self.opened_at + self.every_s

    def threshold(self, current: ThreadPlan) -> float:
        """Hysteresis: a runner already sharing the CPUs counts them shared down to half the threshold."""
        return SHARED_THRESHOLD / 2 if current.shared else SHARED_THRESHOLD

    def decide(self, current: ThreadPlan, candidate: ThreadPlan, now: float) -> bool:
        """Whether to re-create the session with ``candidate`` now."""
        self.next_look = now + self.every_s
        if _key(candidate) == _key(current):
            self.pending, self.seen = None, 0
            return False
        if self.pending is not None and _key(candidate) == _key(self.pending):
            self.seen += 1
        else:
            self.pending, self.seen = candidate, 1
        lighter = (current.spinning and not candidate.spinning) or (
            current.spinning == candidate.spinning and candidate.threads < current.threads
        )
        wait = max(2.5 * self.every_s if lighter else 0.0, self.cost_s / REBUILD_SHARE)
        return self.seen >= (CONFIRM if lighter else QUIET_LOOKS) and now - self.opened_at >= wait

    def rebuilt(self, now: float, cost_s: float) -> None:
        self.opened_at, self.cost_s, self.pending, self.seen = now, cost_s, None, 0
        self.next_look = now + self.every_s


def _key(plan: ThreadPlan) -> tuple[int, bool, bool]:
    # "default" threads are the runtime's own choice (onnxruntime then also pins them): a different session
    return plan.threads, plan.spinning, plan.threads_from == "default"


_MAX_REPLANS_KEPT = 20


class LoadFollower:
    """A long-lived runner's looks at the load (``LoadWatch``) and decisions (``Recheck``), with the record of
    the sessions it re-created. The runner calls ``look`` between two inferences; it returns the plan to
    re-create the session with when one is due (else None), and the runner then reports ``rebuilt``."""

    def __init__(self, every_s: float, opened_at: float) -> None:
        self.watch = LoadWatch()
        now = time.monotonic()
        self.recheck = Recheck(every_s, now, now - opened_at)
        self.opened_at = opened_at
        self.replans: list[dict[str, Any]] = []
        self.stopped = False  # a re-creation failed: the runner keeps the session it has, and stops looking
        self._lock = threading.Lock()  # one look at a time where threads share a runner

    @classmethod
    def start(cls, every_s: float, plan: ThreadPlan, opened_at: float) -> LoadFollower | None:
        """One for a runner opened at ``opened_at`` (``time.monotonic()``) with ``plan``; None where there is
        nothing to follow: looks off (0 s), everything set explicitly, or no /proc/stat."""
        if every_s <= 0 or (plan.threads_from == "option" and plan.spinning_from in ("option", "runtime")):
            return None
        follower = cls(every_s, opened_at)
        return follower if follower.watch.works else None

    def due(self) -> bool:
        return not self.stopped and time.monotonic() >= self.recheck.next_look

    def look(self, current: ThreadPlan, plan_for: Callable[[CpuLoad, float], ThreadPlan]) -> ThreadPlan | None:
        """The plan to re-create the session with now, or None. ``plan_for(load, shared_threshold)``: the plan the
        runner would make with that load."""
        if not self._lock.acquire(False):
            return None
        try:
            load = self.watch.poll()
            now = time.monotonic()
            if load is None:
                self.recheck.next_look = now + self.recheck.every_s
                return None
            candidate = plan_for(load, self.recheck.threshold(current))
            return candidate if self.recheck.decide(current, candidate, now) else None
        finally:
            self._lock.release()

    def rebuilt(self, plan: ThreadPlan, started: float) -> None:
        """The session was re-created with ``plan``, from ``started`` (``time.monotonic()``) to now."""
        now = time.monotonic()
        self.recheck.rebuilt(now, now - started)
        self.replans.append(
            {
                "after_s": round(started - self.opened_at, 1),
                "threads": plan.threads,
                "spinning": plan.spinning,
                "shared": plan.shared,
                "others": round(plan.others, 2),
                "cost_ms": round((now - started) * 1000, 1),
            }
        )
        del self.replans[:-_MAX_REPLANS_KEPT]

    def failed(self, plan: ThreadPlan, started: float, error: BaseException) -> None:
        """Re-creating the session with ``plan`` failed: recorded, and no more looks (the old session runs on)."""
        self.stopped = True
        self.replans.append(
            {
                "after_s": round(started - self.opened_at, 1),
                "threads": plan.threads,
                "spinning": plan.spinning,
                "failed": f"{type(error).__name__}: {str(error)[:200]}; kept the session it had, no more looks",
            }
        )


def policy_json(plan: ThreadPlan, follower: LoadFollower | None) -> dict[str, Any]:
    """``details["threads_policy"]``: the plan now, how often the load is re-checked (None: decided once) and the
    sessions re-created so far."""
    out = plan.to_json()
    out["recheck_s"] = follower.recheck.every_s if follower is not None else None
    out["replans"] = list(follower.replans) if follower is not None else []
    return out
