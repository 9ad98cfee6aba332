"""Toolchain environments: location, status, the explicit install, and driving a driver in one.

The install machinery is exercised for real on a tiny spec (a venv whose only requirement is
pip itself, so no network is needed); the real ``tflite`` toolchain is used by
tests/backends/test_litert_convert.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edge import toolchains
from edge.errors import EdgeError, MissingDependencyError
from edge.pipeline import conversion_problems, plan
from edge.targets import get_target
from tests.support.cli import assert_user_error, run_cli


def _mini_spec(tmp_path: Path, **changes: object) -> toolchains.ToolchainSpec:
    lock = tmp_path / "mini.lock"
    lock.write_text("# nothing pinned\n")
    fields = dict(
        name="mini",
        purpose="test",
        requirements=("pip",),
        lock=str(lock),
        lock_platform="none",
        python_min=(3, 8),
        python_max=(3, 99),
        imports=("json",),
        programs=("pip",),
        versions=(),
        size_hint="a few MB",
    )
    fields.update(changes)
    return toolchains.ToolchainSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
def empty_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "toolchains"
    monkeypatch.setenv(toolchains.ENV_VAR, str(root))
    return root


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> toolchains.ToolchainStatus:
    """One real install of the tiny spec, shared by the tests below (~5-10 s: venv + ensurepip)."""
    tmp = tmp_path_factory.mktemp("mini")
    mp = pytest.MonkeyPatch()
    mp.setenv(toolchains.ENV_VAR, str(tmp / "root"))
    mp.setitem(toolchains.TOOLCHAINS, "mini", _mini_spec(tmp))
    steps: list[str] = []
    try:
        st = toolchains.install("mini", on_step=steps.append, use_reference_lock=False)
        assert any("pip check" in s for s in steps) and "lock hash" in steps[-1]
        yield st
    finally:
        mp.undo()


@pytest.fixture
def use_mini(mini: toolchains.ToolchainStatus) -> toolchains.ToolchainStatus:
    """The installed tiny toolchain (its spec and EDGEKIT_TOOLCHAINS stay set while this module runs)."""
    return toolchains.status("mini")


def test_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(toolchains.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert toolchains.toolchain_dir("tflite") == tmp_path / "cache" / "edgekit" / "toolchains" / "tflite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert toolchains.root() == Path.home() / ".cache" / "edgekit" / "toolchains"
    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path / "tc"))
    assert toolchains.toolchain_dir("tflite") == tmp_path / "tc" / "tflite"
    with pytest.raises(EdgeError, match="unknown toolchain 'tflit'; did you mean 'tflite'"):
        toolchains.status("tflit")


def test_tflite_spec_is_pinned_and_locked() -> None:
    spec = toolchains.get_spec("tflite")
    assert all("==" in r for r in spec.requirements)
    lock = toolchains.lock_lines(spec.lock_text.splitlines())
    pinned = {ln.split("==")[0].lower().replace("_", "-") for ln in lock}
    assert all(ln.count("==") == 1 for ln in lock)
    assert {"onnx2tf", "tensorflow", "onnxsim", "tf-keras", "numpy", "protobuf"} <= pinned
    for req in spec.requirements:  # every top-level pin agrees with the lock
        name, version = req.split("==")
        assert any(ln.lower().replace("_", "-") == f"{name.lower()}=={version}" for ln in lock), req


def test_missing_toolchain_is_reported_before_any_work(empty_root: Path, models: dict[str, Path]) -> None:
    problems = conversion_problems(get_target("arm-xnnpack"))
    assert any("toolchain 'tflite' is not installed" in p and "edgekit toolchain install tflite" in p for p in problems)
    with pytest.raises(MissingDependencyError, match="edgekit toolchain install tflite"):
        plan(get_target("coral-edgetpu"))
    env = {toolchains.ENV_VAR: str(empty_root)}
    doc = run_cli("doctor", "--json", env=env)
    arm = next(t for t in json.loads(doc.stdout)["targets"] if t["target"] == "arm-xnnpack")
    assert not arm["can_convert"] and any("edgekit toolchain install tflite" in p for p in arm["convert_problems"])
    assert_user_error(
        run_cli("convert", str(models["tiny"]), "-t", "arm-xnnpack", "-o", str(empty_root / "b"), env=env),
        "toolchain 'tflite' is not installed",
        "edgekit toolchain install tflite",
    )
    assert not (empty_root / "b").exists() and not (empty_root / "tflite").exists()  # never installed silently
    lst = run_cli("toolchain", "list", "--json", env=env)
    assert lst.returncode == 0 and json.loads(lst.stdout)[0]["installed"] is False


def test_install_refuses_a_python_it_cannot_serve(
    empty_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(toolchains.TOOLCHAINS, "mini", _mini_spec(tmp_path, python_max=(3, 1)))
    with pytest.raises(MissingDependencyError, match=r"needs Python 3.8 to 3.1 .*edgekit runs on Python 3"):
        toolchains.install("mini")
    assert not (empty_root / "mini").exists()


def test_install_records_the_lock(use_mini: toolchains.ToolchainStatus) -> None:
    st = use_mini
    assert st.usable, st.problem
    state = json.loads((st.path / toolchains.STATE_FILE).read_text())
    assert st.lock_hash == toolchains.lock_hash(state["freeze"]) == state["lock_hash"]
    assert state["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert (st.path / "install.log").is_file()
    assert st.manifest_record()["lock_hash"] == st.lock_hash
    again: list[str] = []
    assert toolchains.install("mini", on_step=again.append).lock_hash == st.lock_hash
    assert "already installed" in again[0]


def test_drift_is_detected(
    use_mini: toolchains.ToolchainStatus, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    st = use_mini
    site = next(st.venv.glob("lib/python*/site-packages"))
    extra = site / "sneaky-1.0.dist-info"
    extra.mkdir()
    try:
        assert "changed since it was installed" in (toolchains.status("mini").problem or "")
    finally:
        extra.rmdir()
    assert toolchains.status("mini").usable
    monkeypatch.setitem(toolchains.TOOLCHAINS, "mini", _mini_spec(tmp_path, requirements=("pip", "json5==0.9")))
    assert "installed from another version of its spec" in (toolchains.status("mini").problem or "")
    assert "--force" in toolchains.problems("mini")[0]


def _driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    d = tmp_path / "mini_driver.py"
    d.write_text("import json, os, sys, time\n" + body)
    monkeypatch.setattr(toolchains, "driver_path", lambda name: d)


def test_run_driver(use_mini: toolchains.ToolchainStatus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _driver(
        tmp_path,
        monkeypatch,
        """
job = json.load(open(sys.argv[1]))
print(json.dumps({"event": "stage", "stage": "working"}), flush=True)
print("noise that is not an event", flush=True)
sys.stderr.write("goes to the log\\n")
print(json.dumps({"event": "result", "x": job["x"] * 2, "python": sys.executable,
                  "path0": os.environ["PATH"].split(os.pathsep)[0], "pythonpath": os.environ.get("PYTHONPATH"),
                  "cwd": os.getcwd()}), flush=True)
""",
    )
    monkeypatch.setenv("PYTHONPATH", "/should/not/leak")
    work = tmp_path / "work"
    work.mkdir()
    events: list[dict[str, object]] = []
    final, st = toolchains.run_driver("mini", {"x": 21}, work, on_event=events.append)
    assert final["x"] == 42 and events == [{"event": "stage", "stage": "working"}]
    assert Path(str(final["python"])).parent == st.venv / "bin"
    # edgekit's PYTHONPATH does not leak in; the only entry is the offline guard's directory
    assert final["path0"] == str(st.venv / "bin") and final["pythonpath"] == str(toolchains.offline.GUARD_DIR)
    assert Path(str(final["cwd"])) == work
    assert "goes to the log" in (work / "convert.log").read_text()


_NETWORK_DRIVER = """
import socket, subprocess
port = int(json.load(open(sys.argv[1]))["port"])
out = {}
for name, argv in [("tcp", None), ("udp", None),
                   ("child", [sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))"])]:
    try:
        if name == "tcp":
            socket.socket().connect(("127.0.0.1", port))
        elif name == "udp":
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", port))
        else:
            subprocess.run(argv, check=True, capture_output=True)
        out[name] = "reached"
    except (OSError, subprocess.CalledProcessError) as e:
        out[name] = "refused"
"""


def test_run_driver_is_offline(
    use_mini: toolchains.ToolchainStatus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11, attack 8: a driver and its children reach nothing, and the manifest record says how."""
    import socket

    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(8)
        port = tcp.getsockname()[1]
        udp.bind(("127.0.0.1", port))
        _driver(tmp_path, monkeypatch, _NETWORK_DRIVER + "print(json.dumps({'event': 'result', **out}), flush=True)\n")
        work = tmp_path / "work"
        work.mkdir()
        final, st = toolchains.run_driver("mini", {"port": port}, work)
        assert (final["tcp"], final["udp"], final["child"]) == ("refused", "refused", "refused")
        udp.settimeout(0.2)
        with pytest.raises((TimeoutError, socket.timeout)):
            udp.recv(8)
        tcp.settimeout(0.2)
        with pytest.raises((TimeoutError, socket.timeout)):
            tcp.accept()
    expected = toolchains.network_isolation().enforced
    assert final["offline"]["enforced"] == expected and st.offline == final["offline"]
    assert st.manifest_record()["offline"] == final["offline"]  # what converters write into the manifest
    # under the seccomp filter (inside the namespace too, issue #33) socket() fails before the guard sees a connect:
    # only create_connection, wrapped before it makes a socket, is named
    named = 1 if toolchains.network_isolation().seccomp else 3
    assert len(final["offline"]["attempts"]) == named and final["network_attempts"] == final["offline"]["attempts"]
    assert "offline" not in toolchains.status("mini").to_json()  # only a run has one
    # a driver that dies on a refused connection says so
    _driver(tmp_path, monkeypatch, "import socket; socket.create_connection(('192.0.2.1', 443))\n")
    with pytest.raises(EdgeError, match=r"tried to reach the network, refused: create_connection \('192.0.2.1', 443\)"):
        toolchains.run_driver("mini", {}, work)


def test_run_driver_failures(
    use_mini: toolchains.ToolchainStatus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _driver(tmp_path, monkeypatch, "sys.stderr.write('Traceback: it broke\\n'); sys.exit(3)\n")
    with pytest.raises(EdgeError, match="exited with code 3 without a result: Traceback: it broke"):
        toolchains.run_driver("mini", {}, work)
    _driver(tmp_path, monkeypatch, "print(json.dumps({'event': 'stage', 'stage': 'x'}), flush=True); time.sleep(60)\n")
    with pytest.raises(EdgeError, match="did not finish within 1 s"):
        toolchains.run_driver("mini", {}, work, timeout_s=1.0)


def test_cli_show_and_list(empty_root: Path) -> None:
    env = {toolchains.ENV_VAR: str(empty_root)}
    p = run_cli("toolchain", "show", "tflite", "--json", env=env)
    data = json.loads(p.stdout)
    assert data["installed"] is False and "onnx2tf==1.29.24" in data["requirements"]
    assert "edgekit toolchain install tflite" in data["problem"]
    assert_user_error(run_cli("toolchain", "install", "nope", env=env), "unknown toolchain 'nope'")


def test_torch_toolchain_keeps_its_former_name(empty_root: Path) -> None:
    """``coreml`` (CI's and the README's install command) is the ``torch`` toolchain; an install made under that
    name is used where it is (a venv cannot move) until one exists under the new name."""
    spec = toolchains.get_spec("coreml")
    assert spec is toolchains.get_spec("torch") and spec.name == "torch" and toolchains.aliases() == {"coreml": "torch"}
    listed = [s.name for s in toolchains.list_status()]
    assert "coreml" not in toolchains.TOOLCHAINS and "coreml" not in listed and {"tflite", "torch"} <= set(listed)
    assert toolchains.toolchain_dir("coreml") == toolchains.toolchain_dir("torch") == empty_root / "torch"
    st = toolchains.status("coreml")
    assert st.name == "torch" and not st.installed and "edgekit toolchain install torch" in (st.problem or "")
    (empty_root / "coreml").mkdir(parents=True)
    assert toolchains.toolchain_dir("torch") == empty_root / "torch"  # an unfinished old install is not adopted
    (empty_root / "coreml" / toolchains.STATE_FILE).write_text("{}")
    assert toolchains.toolchain_dir("torch") == toolchains.toolchain_dir("coreml") == empty_root / "coreml"
    assert toolchains.status("torch").installed and toolchains.status("torch").path == empty_root / "coreml"
    (empty_root / "torch").mkdir()
    assert toolchains.toolchain_dir("coreml") == empty_root / "torch"  # the new name wins once it exists
    with pytest.raises(EdgeError, match="unknown toolchain 'corml'; did you mean 'coreml'"):
        toolchains.get_spec("corml")


def test_run_driver_picks_a_driver_of_the_toolchain(
    use_mini: toolchains.ToolchainStatus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One toolchain, several drivers (torch: coreml_driver.py, torch_onnx_driver.py)."""
    asked: list[str] = []
    body = "import json\nprint(json.dumps({'event': 'result', 'ok': True}), flush=True)\n"
    (tmp_path / "other_driver.py").write_text(body)
    monkeypatch.setattr(toolchains, "driver_path", lambda name: asked.append(name) or tmp_path / f"{name}_driver.py")
    work = tmp_path / "work"
    work.mkdir()
    final, _ = toolchains.run_driver("mini", {}, work, driver="other")
    assert final["ok"] is True and asked == ["other"]
    monkeypatch.undo()
    assert toolchains.driver_path("torch_onnx").is_file() and toolchains.driver_path("coreml").is_file()
