"""Real RabbitMQ nodes for tests: plain processes in a temporary directory, loopback only, stopped after.

RabbitMQ 3.10 (Debian 12's ``rabbitmq-server``) with the ``rabbitmq_mqtt`` plugin, which speaks MQTT 3.1.1
only. Each :class:`RabbitCluster` runs its own ``epmd`` on a free loopback port (``ERL_EPMD_PORT``), so it
neither needs nor leaves behind the machine's shared one on 4369; every node gets free ports for AMQP, Erlang
distribution and MQTT, its own Mnesia and log directories, and the cluster's Erlang cookie in ``$HOME`` (the
work directory). The scripts in ``/usr/lib/rabbitmq/bin`` are run directly: the ``/usr/sbin`` wrappers switch
to the ``rabbitmq`` user and its ``/var/lib/rabbitmq``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.mqtt_broker import HOST, free_port, wait_port

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
EPMD = Path("/usr/bin/epmd")


def rabbitmq_missing() -> str | None:
    """Why RabbitMQ cannot run here, or None."""
    if not (RABBIT_BIN / "rabbitmq-server").exists():
        return "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
    if not EPMD.exists():
        return "epmd is not installed (it comes with rabbitmq-server's erlang-base)"
    return None


def rabbitmq_version() -> str:
    base = RABBIT_BIN.parent / "lib"
    names = sorted(p.name for p in base.glob("rabbitmq_server-*")) if base.is_dir() else []
    return names[-1].removeprefix("rabbitmq_server-") if names else "?"


class RabbitNode:
    """One RabbitMQ node of a :class:`RabbitCluster` (not started until ``start()``)."""

    def __init__(self, cluster: RabbitCluster, name: str, extra: str = "") -> None:
        self.cluster, self.short = cluster, name
        self.name = f"edgekit-{name}-{os.getpid()}@localhost"
        self.dir = cluster.workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.amqp_port, self.dist_port, self.port = free_port(), free_port(), free_port()
        self.config = self.dir / "rabbitmq.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = {HOST}:{self.amqp_port}",
                    f"mqtt.listeners.tcp.default = {HOST}:{self.port}",
                    "mqtt.allow_anonymous = true",  # as the built-in guest user, which may log in from loopback only
                    "loopback_users.guest = true",
                    "log.file.level = info",
                    "log.console = false",
                ]
            )
            + "\n"
            + extra
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **self.cluster.env(),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.config),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            # exec the VM (no shell in between): SIGTERM reaches it and it shuts down cleanly by itself
            "RUNNING_UNDER_SYSTEMD": "true",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def spawn(self) -> None:
        with open(self.dir / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                [str(RABBIT_BIN / "rabbitmq-server")],
                cwd=self.dir,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, timeout: float = 120.0) -> RabbitNode:
        """Start the VM and wait until the MQTT listener accepts (the plugin is up)."""
        self.spawn()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"RabbitMQ node {self.name} exited while starting: {self.log()[-3000:]}")
            try:
                wait_port(self.port, timeout=0.5)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"RabbitMQ node {self.name}: no MQTT listener after {timeout} s: {self.log()[-3000:]}"
                    ) from None

    def ctl(self, *args: str, timeout: float = 120.0) -> str:
        """``rabbitmqctl -n <this node> ...``; its output, or an error with it."""
        p = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.name, *args],
            env=self.cluster.env(),
            cwd=self.cluster.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if p.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl -n {self.name} {' '.join(args)}: exit {p.returncode}: {(p.stdout + p.stderr)[-2000:]}"
            )
        return p.stdout

    def join(self, other: RabbitNode) -> None:
        """Make this (running, empty) node a member of ``other``'s cluster, as the RabbitMQ guide says."""
        self.ctl("stop_app")
        self.ctl("join_cluster", other.name)
        self.ctl("start_app")
        self.wait_ready()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        """SIGTERM: a clean shutdown; SIGKILL: a crash. Whatever the VM started dies with its process group."""
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        try:
            os.killpg(p.pid, signal.SIGKILL)  # erl_child_setup, inet_gethost: gone with the VM, made sure
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        out = []
        for f in [self.dir / "stdout.log", *sorted((self.dir / "log").glob("*.log"))]:
            if f.exists():
                out.append(f.read_text(errors="replace"))
        return "\n".join(out)


class RabbitCluster:
    """Its own epmd, a shared Erlang cookie, and the nodes named at creation (start them, then ``join``)."""

    def __init__(self, workdir: Path, names: tuple[str, ...] = ("a",), extra: str = "") -> None:
        """``extra``: more ``rabbitmq.conf`` lines for every node (e.g. ``mqtt.prefetch = 1000``)."""
        missing = rabbitmq_missing()
        if missing:
            pytest.skip(missing)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        cookie = self.workdir / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (self.workdir / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq/rabbitmq-env.conf
        (self.workdir / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        self.epmd_port, self.ctl_port = free_port(), free_port()
        self.epmd: subprocess.Popen[bytes] | None = None
        self.nodes = {n: RabbitNode(self, n, extra) for n in names}

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        return {
            **keep,
            "HOME": str(self.workdir),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_CONF_ENV_FILE": str(self.workdir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            # rabbitmqctl is an Erlang node too: one port of its own (the default range is fixed, 35672+)
            "RABBITMQ_CTL_DIST_PORT_MIN": str(self.ctl_port),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(self.ctl_port),
        }

    def __getitem__(self, name: str) -> RabbitNode:
        return self.nodes[name]

    def start(self) -> RabbitCluster:
        """epmd, then every node at once (on 2 cores they boot faster together than one after the other)."""
        self.epmd = subprocess.Popen(
            [str(EPMD), "-port", str(self.epmd_port), "-address", HOST],
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_port(self.epmd_port)
        try:
            for node in self.nodes.values():
                node.spawn()
            for node in self.nodes.values():
                node.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        p, self.epmd = self.epmd, None
        if p is not None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> RabbitCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
