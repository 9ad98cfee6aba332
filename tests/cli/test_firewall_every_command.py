"""The exception firewall on EVERY command (issue #23, class 3): the test walks the typer app, finds each
command and subcommand (and a group's own callback, like ``edgekit targets``), and for each one makes the
one library function the command calls raise an unexpected ``RuntimeError``. The answer must be one line
on stderr (``internal error in STEP: Type: message; details in FILE``), exit code 3, and FILE must hold the
traceback. A command added to the CLI without an entry in :data:`FAULTS` fails
:func:`test_every_command_has_a_fault_case`, so a new command cannot ship without the firewall being checked.

In-process (typer's CliRunner) to stay cheap: ~45 commands, no interpreter start each; the console script's
own path (``edgekit`` in a subprocess, sitecustomize injection) is ``test_firewall.py``'s."""

from __future__ import annotations

import importlib
import logging
import re
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from edge.cli import app
from edge.pipeline import convert

#: command path -> (the library function it calls, as "module:attr.path", and its argv after the path).
#: {model}, {bundle}, {tmp}, {file} are filled in. Several commands have more than one case (``--explain``).
FAULTS: dict[str, list[tuple[str, list[str]]]] = {
    "doctor": [("edge.doctor:doctor", [])],
    "convert": [
        ("edge.pipeline.sources:OnnxSource.io", ["{model}", "-t", "x86-cpu", "-o", "{tmp}/out"]),
        ("edge.pipeline.explain:explain", ["{model}", "-t", "x86-cpu", "--explain"]),
    ],
    "finish": [("edge.backends.litert.edgetpu:finish_bundle", ["{bundle}", "-o", "{tmp}/fin"])],
    "bench": [("edge.bundle.bundle:Bundle.open", ["{bundle}"])],
    "verify": [("edge.verify.isa:verify_isa", ["{bundle}"])],
    "tune": [("edge.tune.search:tune", ["{model}", "-t", "x86-cpu", "--out", "{tmp}/t", "--max-trials", "1"])],
    "deploy": [("edge.deploy:deploy", ["{model}", "-t", "x86-cpu", "-d", "{tmp}/dev"])],
    "rollback": [("edge.store:rollback", ["-d", "{tmp}/dev"])],
    "run": [("edge.bundle.bundle:Bundle.open", ["{bundle}", "--synthetic", "64x64", "--max-frames", "2"])],
    "agent": [("edge.agent.main:config_from", ["--device-id", "d1", "--store", "{tmp}/store", "--duration", "1"])],
    "sign": [("edge.bundle.signing:configured_sign_key", ["{bundle}", "--key", "{tmp}/k"])],
    "targets": [("edge.targets:load_targets", [])],
    "targets show": [("edge.targets:get_target", ["x86-cpu"])],
    "fleet tune": [("edge.tune.remote:tune_on_device", ["{model}", "--device", "d1", "--out", "{tmp}/ft"])],
    "fleet collect": [("edge.fleet.db:check_url", ["--db", "{tmp}/fleet.sqlite"])],
    "fleet metrics": [("edge.fleet.db:open_db", ["--db", "{tmp}/fleet.sqlite"])],
    "fleet prune": [("edge.fleet.retention:prune_url", ["--db", "{tmp}/fleet.sqlite", "--older-than", "7d"])],
    "fleet partition": [("edge.fleet.migrate:partition_url", ["--db", "{tmp}/fleet.sqlite"])],
    "fleet status": [("edge.fleet.status:fleet_status", ["--db", "{tmp}/fleet.sqlite"])],
    "fleet provision": [("edge.fleet.pki:provision", ["d1", "--ca", "{tmp}/ca", "--out", "{tmp}/p"])],
    "fleet csr": [("edge.fleet.pki:make_device_key_and_csr", ["d1", "--out", "{tmp}/csr"])],
    "fleet sign-csr": [("edge.fleet.pki:sign_csr", ["{file}", "--ca", "{tmp}/ca", "--out", "{tmp}/c.pem"])],
    "fleet acl": [("edge.fleet.acl:write_acl", ["--fleet", "f1", "--out", "{tmp}/acl"])],
    "fleet trust-key": [("edge.mqtt.identity:read_public", ["d1", "{file}", "--db", "{tmp}/fleet.sqlite"])],
    "fleet forget-key": [("edge.fleet.device_keys:forget_key", ["d1", "--db", "{tmp}/fleet.sqlite"])],
    "fleet ca init": [("edge.fleet.pki:init_ca", ["--dir", "{tmp}/ca"])],
    "fleet rollout start": [
        (
            "edge.fleet.rollout:RolloutSpec.parse",
            ["{bundle}", "--fleet", "f1", "--artifact-url", "http://h/a.tar", "--db", "{tmp}/f"],
        )
    ],
    "fleet rollout status": [("edge.fleet.db:open_db", ["r1", "--db", "{tmp}/f"])],
    "fleet rollout pause": [("edge.fleet.db:open_db", ["r1", "--db", "{tmp}/f"])],
    "fleet rollout resume": [("edge.fleet.db:open_db", ["r1", "--db", "{tmp}/f"])],
    "fleet rollout abort": [("edge.fleet.db:open_db", ["r1", "--db", "{tmp}/f"])],
    "fleet rollout pack": [("edge.bundle.archive:pack_bundle", ["{bundle}", "{tmp}/b.tar"])],
    "keys generate": [("edge.bundle.signing:generate_key", ["k1", "--dir", "{tmp}/keys"])],
    "keys list": [("edge.bundle.signing:list_keys", ["--dir", "{tmp}/keys"])],
    "keys export": [("edge.bundle.signing:export_public_key", ["k1", "--dir", "{tmp}/keys"])],
    "trust add": [("edge.bundle.trust:TrustStore.add_key", ["{file}", "--trust-dir", "{tmp}/trust"])],
    "trust revoke": [("edge.bundle.trust:TrustStore.revoke", ["abc", "--trust-dir", "{tmp}/trust"])],
    "trust target": [("edge.bundle.trust:TrustStore.set_targets", ["x86-cpu", "--trust-dir", "{tmp}/trust"])],
    "trust list": [("edge.bundle.trust:TrustStore.keys", ["--trust-dir", "{tmp}"])],
    # install and remove: the injected function IS the one that would touch the shared toolchains
    "toolchain list": [("edge.toolchains:list_status", [])],
    "toolchain install": [("edge.toolchains:install", ["tflite", "--json"])],
    "toolchain show": [("edge.toolchains:status", ["tflite"])],
    "toolchain lock": [("edge.toolchains:require", ["tflite"])],
    "toolchain remove": [("edge.toolchains:remove", ["tflite"])],
    "firmware c-array": [("edge.backends.litert.firmware:write_c_array", ["{file}", "-o", "{tmp}/m.cc"])],
    "firmware ethos-u": [("edge.backends.ethosu.firmware:write_firmware", ["{bundle}", "-o", "{tmp}/fw"])],
}

LINE = re.compile(
    r"^error: internal error in (?P<step>[a-z -]+): RuntimeError: injected fault in (?P<attr>[\w.]+) \| second line; "
    r"details in (?P<file>\S+\.log)$"
)


def discover() -> list[str]:
    """Every command path of the app: leaves, and groups with a callback of their own that does work
    (``invoke_without_command``: ``edgekit targets`` lists targets)."""
    found: list[str] = []

    def walk(cmd: Any, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            found.append(" ".join(path))
            return
        if path and cmd.callback is not None and getattr(cmd, "invoke_without_command", False):
            found.append(" ".join(path))
        for name, sub in subs.items():
            walk(sub, [*path, name])

    walk(get_command(app), [])
    return found


def test_every_command_has_a_fault_case() -> None:
    found = set(discover())
    assert len(found) >= 40, sorted(found)  # the walk itself works (a broken walk must not pass vacuously)
    missing, stale = found - FAULTS.keys(), FAULTS.keys() - found
    assert not missing, f"commands without a firewall case in FAULTS (add one): {sorted(missing)}"
    assert not stale, f"FAULTS names commands the CLI no longer has: {sorted(stale)}"


def inject(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    """Replace ``module:attr.path`` with a function that raises, and every ``edge.cli`` module's own
    reference to the same object (a command module may import the function at module level)."""
    module, _, attr = spec.partition(":")
    owner: Any = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    def injected(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"injected fault in {attr}\nsecond line")

    monkeypatch.setattr(owner, name, staticmethod(injected) if isinstance(original, staticmethod) else injected)
    if path:
        return
    for modname, mod in list(sys.modules.items()):
        if modname.startswith("edge.cli") and getattr(mod, name, None) is original:
            monkeypatch.setattr(mod, name, injected)


@pytest.fixture(scope="module")
def bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "tiny"
    convert(models["tiny"], "x86-cpu", out)
    return out


@pytest.fixture
def quiet_logging() -> Iterator[None]:
    """Commands that set up logging (agent, collector, rollout) add handlers on CliRunner's streams: undone."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


CASES = [(path, spec, args) for path, cases in FAULTS.items() for spec, args in cases]


@pytest.mark.parametrize("path, spec, args", CASES, ids=[f"{p}:{s.split(':')[1]}" for p, s, _ in CASES])
@pytest.mark.usefixtures("quiet_logging")
def test_each_command_fails_as_one_line_exit_3_and_a_log(
    path: str,
    spec: str,
    args: list[str],
    models: dict[str, Path],
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logs = tmp_path / "crashes"
    monkeypatch.setenv("EDGEKIT_LOG_DIR", str(logs))
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.delenv("EDGEKIT_SIGN_KEY", raising=False)
    some_file = tmp_path / "some.file"
    some_file.write_bytes(b"x" * 64)
    argv = path.split() + [a.format(model=models["tiny"], bundle=bundle, tmp=tmp_path, file=some_file) for a in args]
    inject(monkeypatch, spec)
    r = CliRunner().invoke(app, argv, catch_exceptions=True)
    assert r.exception is None or isinstance(r.exception, SystemExit), (r.exception, r.output)
    assert r.exit_code == 3, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, r.stderr
    m = LINE.match(errors[0])
    assert m is not None, errors[0]
    assert m.group("step") == path and m.group("attr") == spec.split(":")[1], errors[0]
    log = Path(m.group("file"))
    assert log.parent == logs and log.is_file() and (log.stat().st_mode & 0o077) == 0
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in injected" in text


def test_a_thread_a_command_starts_dies_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that dies of a bug (a video stage, an HTTP server, a loop) printed Python's traceback: now one
    line through the same firewall, its traceback in the log; the command itself goes on."""
    import threading

    import edge.cli.doctor

    def doctor_with_a_dying_thread(*args: Any, **kwargs: Any) -> list[Any]:
        t = threading.Thread(target=lambda: {}["no-such-key"], name="edgekit-test-worker")
        t.start()
        t.join()
        return []

    monkeypatch.setenv("EDGEKIT_LOG_DIR", str(tmp_path / "crashes"))
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setattr(edge.cli.doctor, "doctor", doctor_with_a_dying_thread)
    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(
        "error: internal error in thread edgekit-test-worker: KeyError: 'no-such-key'; details in "
    )
    log = Path(lines[0].rsplit("details in ", 1)[1])
    assert log.parent == tmp_path / "crashes" and "Traceback (most recent call last)" in log.read_text()
