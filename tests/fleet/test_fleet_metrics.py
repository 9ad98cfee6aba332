"""Prometheus /metrics and the Grafana dashboard against a real Mosquitto, a real collector and real device sessions.

Devices are the agent's own ``DeviceSession`` (birth, will, sequence numbers, outbox) with chosen bodies, so
every value scraped can be checked against what was sent, plus one real ``Agent`` whose reported state reaches
the metrics through its ``state`` stream.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (pip install 'edgekit-ml[fleet]')")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from edge.agent.agent import Agent, AgentConfig  # noqa: E402
from edge.fleet.collector import Collector, CollectorConfig  # noqa: E402
from edge.fleet.metrics import METRICS, ROLLOUT_STATES, MetricsServer, quantile  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.desired import REASONS, STATES, Reason, ReportedState  # noqa: E402
from edge.mqtt.netloop import Backoff, NetworkLoop  # noqa: E402
from edge.mqtt.outbox import MemoryOutbox  # noqa: E402
from edge.mqtt.session import DeviceSession, SessionOptions  # noqa: E402
from tests.support.cli import assert_user_error, run_cli, wait_for  # noqa: E402

FAST = Backoff(0.05, 0.5)
DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "edgekit-fleet.json"


pytestmark = pytest.mark.usefixtures("no_leaked_threads")  # tests/conftest.py


def birth(target: str, bundle: str, fallback: bool = False) -> dict[str, Any]:
    return {
        "state": "running",
        "agent": {"edgekit_version": "0.1.0", "interval_s": 1.0},
        "bundle": {"id": bundle, "target": target, "precision": "fp32"},
        "runner": {
            "runtime": "onnxruntime 1.22",
            "device_requested": "CUDAExecutionProvider" if fallback else "CPUExecutionProvider",
            "device_used": "CPUExecutionProvider",
            "fallback": "CUDA is not available: running on the CPU" if fallback else None,
        },
        "host": {"hostname": "box"},
    }


def telemetry(bundle: str, p50: float, p99: float, fps: float, misses: int, frames: int = 100) -> dict[str, Any]:
    return {
        "interval_s": 1.0,
        "state": "running",
        "bundle_id": bundle,
        "inference": {
            "frames": frames,
            "fps": fps,
            "budget_ms": 20.0,
            "budget_misses": misses,
            "latency_ms": {"count": frames, "p50_ms": p50, "p99_ms": p99, "max_ms": p99 + 1},
        },
        "process": {"cpu_percent": 10.0, "rss_mb": 30.0},
        "spool": {"pending": 0, "dropped_total": 0},
    }


def rollout(rid: str, desired: str, state: str, reason: str | None = None) -> dict[str, Any]:
    return {
        "state": "running",
        "detail": None,
        "bundle_id": None,
        "rollout": {
            "rollout_id": rid,
            "desired_bundle": desired,
            "desired_version": 2,
            "state": state,
            "reason": reason,
        },
    }


# device id -> (target, bundle, fallback, (p50, p99, fps, misses), rollout state or None)
DEVICES: dict[str, tuple[str, str, bool, tuple[float, float, float, int], tuple[str, str | None] | None]] = {
    "cam-01": ("x86-cpu", "base", False, (5.0, 10.0, 30.0, 0), None),
    "cam-02": ("x86-cpu", "base", False, (6.0, 12.0, 29.0, 1), ("rolled-back", "watch_p99_over_budget")),
    "cam-03": ("x86-cpu", "base", False, (7.0, 14.0, 28.0, 2), None),
    "cam-04": ("x86-cpu", "canary", False, (15.0, 30.0, 20.0, 40), ("running", None)),
    "cam-05": ("x86-cpu", "canary", True, (20.0, 40.0, 10.0, 60), ("watching", None)),
    "cam-06": ("jetson-orin", "base", False, (2.0, 3.0, 60.0, 0), None),
    "cam-07": ('x86 cpu"} evil', "base", False, (1.0, 1.0, 1.0, 0), None),  # not a label value: folded
}
GONE = "cam-08"  # births, then stops cleanly: offline


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    """The sample with exactly these labels (a collector's counters: whatever its ``collector`` label)."""
    got = samples.get((name, frozenset(labels.items())))
    if got is None and name.startswith("edgekit_collector") and "collector" not in labels:
        for (n, ls), v in samples.items():
            if n == name and {k: x for k, x in ls if k != "collector"} == labels:
                return v
    return got


def check_promtool(url: str) -> None:
    """``promtool check metrics`` (Debian's ``prometheus`` package) on the exposition as served: exit 0, no lint
    finding (it used to fail: ``_ms`` units, gauges with a ``quantile`` label)."""
    import shutil
    import subprocess

    exe = shutil.which("promtool")
    if exe is None:
        return  # CI without the prometheus package: the rest of the test stands
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read()
    p = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (p.stdout, p.stderr)


def add_rollout(url: str) -> None:
    """A rollout the controller aborted, as its tables keep it: cam-01 and cam-02 were given bundle "canary",
    cam-02 rolled back on its own (watch_p99_over_budget), cam-01 ran it and was rolled back by the abort; both
    report ``running`` on "base" now."""
    from edge.fleet.db import open_db
    from edge.fleet.rollout_store import Assignment, RolloutStore

    art = {"url": "http://127.0.0.1:9/canary.tar", "sha256": "ab" * 32, "size": 10}
    with open_db(url) as db:
        st = RolloutStore(db)
        st.create("r9", "lab", {}, 1.0)
        st.add_cohort("r9", "x86-cpu", "canary", art, 1.0)
        for dev in ("cam-01", "cam-02"):
            st.assign("r9", Assignment(dev, "x86-cpu", 0, 2, 1, "base", art), 1.0)
        st.update_device("r9", "cam-01", 2.0, state="running", rb_version=3, rb_state="running")
        st.update_device("r9", "cam-02", 2.0, state="rolled-back", reason="watch_p99_over_budget")
        st.update_cohort("r9", "x86-cpu", 3.0, state="aborted", reason="rolled_back>0")
        st.set_rollout_state("r9", "aborted", "x86-cpu: aborted", 3.0)
        db.commit()


def test_metrics_from_a_real_collector_and_the_dashboard_names(broker: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fleet.db"
    cfg = CollectorConfig(BrokerConfig.from_url(broker.url), url, backoff=FAST, batch_interval_ms=10)
    loop = NetworkLoop(name="edgekit-test-devices").start()
    sessions: list[DeviceSession] = []
    agent: Agent | None = None
    try:
        with Collector(cfg) as collector, MetricsServer(url, port=0, collector=collector) as server:
            add_rollout(url)
            bcfg = BrokerConfig.from_url(broker.url)
            for dev, (target, bundle, fb, _, _) in [*DEVICES.items(), (GONE, ("x86-cpu", "base", False, None, None))]:
                s = DeviceSession(
                    loop,
                    bcfg,
                    "lab",
                    dev,
                    MemoryOutbox(),
                    options=SessionOptions(backoff=FAST),
                    birth_body=lambda t=target, b=bundle, f=fb: birth(t, b, f),
                )
                sessions.append(s)
                loop.run(s.start)
            wait_for(lambda: all(s.connected for s in sessions), 20, "device sessions connected")
            sent = 0
            for s in sessions[:-1]:
                target, bundle, _, (p50, p99, fps, misses), ro = DEVICES[s.device]
                loop.run(s.submit, "telemetry", telemetry(bundle, p50, p99, fps, misses))
                sent += 1
                if ro is not None:
                    loop.run(s.submit, "state", rollout("r1", "canary", ro[0], ro[1]))
            gone = sessions[-1]
            gone.close(timeout=5.0)  # death: the device is offline
            # a real agent (no runtime) whose reported state travels in its state stream
            store = tmp_path / "store"
            store.mkdir()
            agent = Agent(
                AgentConfig(
                    fleet="lab",
                    device_id="agent-01",
                    broker=bcfg,
                    store=store,
                    source="none",
                    interval_s=0.5,
                    poll_current_s=0,
                    desired=False,
                    backoff=FAST,
                )
            ).start()
            agent.report(
                ReportedState(
                    state="failed",
                    bundle_running=None,
                    rollout_id="r2",
                    desired_version=3,
                    desired_bundle="b2",
                    reason=Reason("download_failed", "HTTP 404", "downloading"),
                )
            )

            def ready() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
                m = scrape(server.url)
                ok = (
                    value(
                        m,
                        "edgekit_rollout_failures",
                        fleet="lab",
                        rollout="r2",
                        target="unknown",
                        desired_bundle="b2",
                        reason="download_failed",
                    )
                    == 1
                    and value(m, "edgekit_devices", fleet="lab", target="x86-cpu", bundle="base", status="offline") == 1
                    and value(m, "edgekit_collector_stored_total", kind="telemetry") is not None
                    and value(m, "edgekit_collector_stored_total", kind="telemetry") >= sent
                    and value(
                        m,
                        "edgekit_rollout_devices",
                        fleet="lab",
                        rollout="r1",
                        target="x86-cpu",
                        desired_bundle="canary",
                        state="watching",
                    )
                    == 1
                )
                return m if ok else None

            m = wait_for(ready, 30, "the collector to store every message and the scrape to show it")
            base = dict(fleet="lab", target="x86-cpu", bundle="base")
            canary = dict(fleet="lab", target="x86-cpu", bundle="canary")
            assert value(m, "edgekit_devices", **base, status="online") == 3
            assert value(m, "edgekit_devices", **canary, status="online") == 2
            assert value(m, "edgekit_devices", **canary, status="offline") == 0
            assert value(m, "edgekit_devices", fleet="lab", target="jetson-orin", bundle="base", status="online") == 1
            # quantiles across the online devices' latest windows: what was sent
            # quantiles across the online devices' latest windows: what was sent, in seconds (summaries)
            assert value(m, "edgekit_latency_p99_seconds", **base, quantile="0.5") == pytest.approx(0.012)
            assert value(m, "edgekit_latency_p99_seconds", **base, quantile="1") == pytest.approx(0.014)
            assert value(m, "edgekit_latency_p99_seconds", **base, quantile="0") == pytest.approx(0.010)
            assert value(m, "edgekit_latency_p99_seconds", **base, quantile="0.9") == pytest.approx(
                quantile([10, 12, 14], 0.9) / 1000
            )
            assert value(m, "edgekit_latency_p99_seconds_count", **base) == 3
            assert value(m, "edgekit_latency_p99_seconds_sum", **base) == pytest.approx(0.036)
            assert value(m, "edgekit_latency_p50_seconds", **canary, quantile="0.5") == pytest.approx(0.0175)
            assert value(m, "edgekit_fps", **canary, quantile="0") == 10.0
            assert value(m, "edgekit_budget_seconds", **canary) == pytest.approx(0.02)
            assert value(m, "edgekit_budget_miss_ratio", **base) == pytest.approx(3 / 300)
            assert (
                value(m, "edgekit_devices_over_budget", **canary) == 2
                and value(m, "edgekit_devices_over_budget", **base) == 0
            )
            assert (
                value(m, "edgekit_devices_fallback", **canary) == 1
                and value(m, "edgekit_devices_fallback", **base) == 0
            )
            assert value(m, "edgekit_devices_error", **base) == 0
            # rollout progress from the devices' state streams
            r1 = dict(fleet="lab", rollout="r1", target="x86-cpu", desired_bundle="canary")
            assert {
                st: value(m, "edgekit_rollout_devices", **r1, state=st)
                for st in ("running", "watching", "rolled-back", "failed")
            } == {"running": 1, "watching": 1, "rolled-back": 1, "failed": 0}
            assert value(m, "edgekit_rollout_devices_on_desired", **r1) == 2  # cam-02 rolled back to base
            assert value(m, "edgekit_rollout_failures", **r1, reason="watch_p99_over_budget") == 1
            # what rollout r9 did, from the controller's tables, though its devices report "running" on base now
            r9 = dict(fleet="lab", rollout="r9", target="x86-cpu", bundle="canary")
            assert value(m, "edgekit_rollout_info", fleet="lab", rollout="r9", state="aborted") == 1
            assert value(m, "edgekit_rollout_cohort_state", **r9, state="aborted") == 1
            assert value(m, "edgekit_rollout_cohort_devices_on_bundle", **r9) == 0
            assert value(m, "edgekit_rollout_cohort_failed_devices", **r9, reason="watch_p99_over_budget") == 1
            assert value(m, "edgekit_rollout_cohort_devices", **r9, outcome="rolled-back") == 1
            assert value(m, "edgekit_rollout_cohort_rollbacks", **r9, state="running") == 1
            # a target that is not a label value is folded into "other" and counted, never exported
            assert value(m, "edgekit_devices", fleet="lab", target="other", bundle="other", status="online") == 1
            assert value(m, "edgekit_fleet_label_overflow") == 1 and value(m, "edgekit_fleet_scrape_ok") == 1
            assert value(m, "edgekit_collector_connected") == 1
            assert value(m, "edgekit_collector_rejected_total", reason="malformed") == 0
            # no device id in any label
            device_ids = set(DEVICES) | {GONE, "agent-01"}
            assert not {v for (_, labels) in m for _, v in labels} & device_ids
            check_dashboard(m)
            check_promtool(server.url)
    finally:
        if agent is not None:
            agent.stop(flush_timeout=2.0)
        for s in sessions:
            if s.conn.connected:
                s.close(timeout=2.0)
        loop.stop()


# the dashboard ------------------------------------------------------------------------------------------
_PROMQL_WORDS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "histogram_quantile",
    "abs",
    "clamp_min",
    "clamp_max",
    "label_values",
    "vector",
    "scalar",
    "time",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "sum_over_time",
    "count_values",
    "absent",
    "sort",
    "sort_desc",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, label matchers, grouping lists, ranges taken out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range selectors
    e = re.sub(r"\$\w+|\$\{[^}]*\}", " ", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end() :].lstrip()
        if after.startswith("(") or word in _PROMQL_WORDS or re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def test_promql_parser() -> None:  # the checker itself must find names, or the dashboard check proves nothing
    assert metric_names(
        'sum by (target, bundle) (rate(edgekit_x_total{fleet=~"$fleet",a="b{c}"}[5m])) / sum(edgekit_y) > 0'
    ) == {"edgekit_x_total", "edgekit_y"}
    assert metric_names('label_values(edgekit_devices{fleet=~"$fleet"}, target)') == {"edgekit_devices", "target"}


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            exprs.append(v["definition"])
    return exprs


def check_dashboard(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> None:
    scraped = {name for name, _ in samples}
    used: set[str] = set()
    for expr in dashboard_queries():
        names = metric_names(re.sub(r"label_values\((.*),\s*\w+\)$", r"\1", expr))
        assert names, f"no metric in {expr!r}"
        used |= names
    missing = used - scraped
    assert not missing, f"the dashboard queries metrics the scrape does not have: {sorted(missing)}"
    assert {n for n in used if not n.startswith("edgekit_collector")} <= set(METRICS) | {
        n for n in used if n.endswith("_total")
    }


def test_dashboard_is_provisioning_ready() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "edgekit-fleet" and "id" not in dash  # provisioning assigns the id; the uid is stable
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for needle in ("latency", "fps", "fallback", "online", "offline", "rollout progress", "canary beside baseline"):
        assert needle in titles, needle
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
    prov = DASHBOARD.parent / "provisioning"
    dashboards = (prov / "dashboards" / "edgekit.yaml").read_text()
    datasources = (prov / "datasources" / "prometheus.yaml").read_text()
    assert "apiVersion: 1" in dashboards and "type: file" in dashboards and "path:" in dashboards
    assert "apiVersion: 1" in datasources and "type: prometheus" in datasources
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    assert yaml.safe_load(dashboards)["providers"][0]["options"]["path"]
    assert yaml.safe_load(datasources)["datasources"][0]["type"] == "prometheus"


def test_closed_sets_match_the_agent() -> None:
    assert ROLLOUT_STATES == STATES
    from edge.fleet import metrics

    assert all(metrics._REASON.fullmatch(r) for r in REASONS)


def test_metrics_cli_bad_input(tmp_path: Path) -> None:
    assert_user_error(
        run_cli("fleet", "metrics", "--db", f"sqlite:///{tmp_path}/nope.db", "--duration", "0"), "does not exist"
    )
    assert_user_error(run_cli("fleet", "metrics", "--db", "mysql://x/y", "--duration", "0"), "unsupported database URL")


def _scrape_when_up(url: str, proc: Any, timeout: float = 30.0) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    def up() -> Any:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return scrape(url)
        except OSError:
            return None

    return wait_for(up, timeout, f"{url} to answer")


def test_collect_metrics_port_and_standalone_metrics(broker: Any, tmp_path: Path) -> None:
    """The CLI: `fleet collect --metrics-port` serves fleet and collector metrics; `fleet metrics` the fleet's
    alone from the same database; both stop cleanly on SIGTERM."""
    import signal
    import subprocess

    from tests.support.cli import EDGEKIT
    from tests.support.mqtt_broker import free_port

    url = f"sqlite:///{tmp_path}/fleet.db"
    with socket.socket() as busy:  # a port in use: one line, nothing started, no database created
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert_user_error(
            run_cli(
                "fleet",
                "collect",
                "--broker",
                broker.url,
                "--db",
                url,
                "--metrics-port",
                str(busy.getsockname()[1]),
                "--duration",
                "5",
            ),
            "cannot serve metrics",
            "in use",
        )
    assert not (tmp_path / "fleet.db").exists()
    port = free_port()
    collect = subprocess.Popen(
        [
            EDGEKIT,
            "fleet",
            "collect",
            "--broker",
            broker.url,
            "--db",
            url,
            "--metrics-port",
            str(port),
            "--duration",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _scrape_when_up(f"http://127.0.0.1:{port}/metrics", collect)
        m = wait_for(
            lambda: (lambda s: s if value(s, "edgekit_collector_connected") == 1 else None)(
                scrape(f"http://127.0.0.1:{port}/metrics")
            ),
            20,
            "the collector to connect",
        )
        assert value(m, "edgekit_fleet_scrape_ok") == 1 and value(m, "edgekit_collector_received_total") == 0
    finally:
        collect.send_signal(signal.SIGINT)
        out, err = collect.communicate(timeout=30)
    assert collect.returncode == 0, err
    port = free_port()
    metrics = subprocess.Popen(
        [EDGEKIT, "fleet", "metrics", "--db", url, "--port", str(port), "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        m = _scrape_when_up(f"http://127.0.0.1:{port}/metrics", metrics)
        assert value(m, "edgekit_fleet_scrape_ok") == 1
        assert not any(name.startswith("edgekit_collector") for name, _ in m)  # no collector in this process
    finally:
        metrics.send_signal(signal.SIGTERM)
        out, err = metrics.communicate(timeout=30)
    assert metrics.returncode == 0, err


# the reader on both databases, without a broker: the collector's library stores, the reader aggregates ----------
def _msg(kind: str, device: str, seq: int, body: dict[str, Any], session: int = 1000) -> tuple[str, bytes]:
    from edge.mqtt.payloads import encode, message

    return f"edgekit/lab/{device}/{kind}", encode(message(kind, "lab", device, session, seq, body, ts=time.time()))


def reader_scenario(url: str) -> None:
    from edge.fleet.db import open_db
    from edge.fleet.metrics import FleetReader

    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url))
    try:
        for i, dev in enumerate(("a", "b", "c")):
            c.handle(*_msg("birth", dev, 0, {"connection": 1, **birth("x86-cpu", "base", fallback=dev == "c")}))
            c.handle(*_msg("telemetry", dev, 1, telemetry("base", 5.0 + i, 10.0 + i, 30.0, 0)))
            c.handle(*_msg("state", dev, 2, rollout("r7", "new", "downloading")))
        c.flush()
        reader = FleetReader()
        with open_db(url) as db:
            snap = reader.read(db)
            g = snap.groups[("lab", "x86-cpu", "base")]
            assert g.counts["online"] == 3 and g.fallback == 1 and sorted(g.p99) == [10.0, 11.0, 12.0]
            assert snap.rollouts[("lab", "r7", "x86-cpu", "new")].states == {"downloading": 3}
            # one device moves on: only its new state message is read again, the others come from the cache
            c.handle(*_msg("state", "b", 3, rollout("r7", "new", "rolled-back", "watch_fallback")))
            c.flush()
            snap = reader.read(db)
            r = snap.rollouts[("lab", "r7", "x86-cpu", "new")]
            assert r.states == {"downloading": 2, "rolled-back": 1} and r.reasons == {"watch_fallback": 1}
            # a restarted device (new session) with no state message yet keeps its last known rollout
            c.handle(*_msg("telemetry", "a", 1, telemetry("base", 5.0, 10.0, 30.0, 0), session=2000))
            c.flush()
            assert reader.read(db).rollouts[("lab", "r7", "x86-cpu", "new")].states["downloading"] == 2
    finally:
        c.db.close()


def test_reader_on_sqlite(tmp_path: Path) -> None:
    reader_scenario(f"sqlite:///{tmp_path}/fleet.db")


def test_reader_on_postgresql(postgres_url: str) -> None:
    reader_scenario(postgres_url)


def test_two_collectors_on_one_database_count_each_device_once(tmp_path: Path) -> None:
    """Issue #33 item 2: two collectors' metrics on one database (each scraped): the online count was doubled
    (4 for 2 devices), and their counters carried no label to tell them apart. Now one holds the metrics lease
    and serves the fleet's gauges, both serve their own counters labelled ``collector``; a clean stop hands the
    lease on at once."""
    url = f"sqlite:///{tmp_path}/fleet.db"
    cols = [Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, client_id=f"collector-{i}")) for i in (1, 2)]
    try:
        for i, dev in enumerate(("a", "b")):
            cols[i].handle(*_msg("birth", dev, 0, {"connection": 1, **birth("x86-cpu", "base")}))
            cols[i].handle(*_msg("telemetry", dev, 1, telemetry("base", 5.0, 10.0, 30.0, 0)))
            cols[i].flush()
        servers = [MetricsServer(url, port=0, collector=c) for c in cols]
        leader = -1
        try:
            scrapes = [scrape(s.url) for s in servers]
            online = [
                value(m, "edgekit_devices", fleet="lab", target="x86-cpu", bundle="base", status="online")
                for m in scrapes
            ]
            assert sum(v or 0 for v in online) == 2, online  # each device once over both
            assert sorted(value(m, "edgekit_fleet_metrics_leader") for m in scrapes) == [0, 1]
            for i, m in enumerate(scrapes):
                assert value(m, "edgekit_collector_stored_total", collector=f"collector-{i + 1}", kind="telemetry") == 1
            leader = [value(m, "edgekit_fleet_metrics_leader") for m in scrapes].index(1)
            servers[leader].close()
            other = scrape(servers[1 - leader].url)
            assert value(other, "edgekit_fleet_metrics_leader") == 1
            assert value(other, "edgekit_devices", fleet="lab", target="x86-cpu", bundle="base", status="online") == 2
        finally:
            for i, s in enumerate(servers):
                if i != leader:
                    s.close()
    finally:
        for c in cols:
            c.db.close()
