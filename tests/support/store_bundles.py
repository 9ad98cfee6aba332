"""Bundles for the store tests: one real conversion of the tiny model, cloned under other ids.

A clone differs only in ``bundle_id`` (its artifact and hashes are the converted model's), so
a test can ship dozens of distinct bundles in milliseconds. Imported by tests/test_store_*.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from edge.bundle.bundle import MANIFEST, Bundle


def clone_dir(base: Bundle, root: Path, bundle_id: str) -> Path:
    """A copy of ``base`` in ``root/<safe name>`` whose manifest says ``bundle_id`` (any string, even a hostile one)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in bundle_id).strip(".") or "_"
    d = root / f"clone-{safe}-{hashlib.sha256(bundle_id.encode()).hexdigest()[:8]}"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(base.path, d)
    m = json.loads((d / MANIFEST).read_text())
    m["bundle_id"] = bundle_id
    (d / MANIFEST).write_text(json.dumps(m, indent=2))
    return d


def clone_bundle(base: Bundle, root: Path, bundle_id: str) -> Bundle:
    return Bundle.open(clone_dir(base, root, bundle_id))


# Writers killed with SIGKILL. One server subprocess imports edgekit once and forks a writer per
# request: the writer deploys the "before" bundles, then runs the operation with a step hook (a
# DeviceStore constructor option, no global) that SIGKILLs it at one step — or the server kills it
# at a random moment after it reports that it started the operation.
KILL_SERVER = r"""
import json, os, signal, sys, time
from edge.bundle.bundle import Bundle
from edge.store import DeviceStore

import tempfile
with tempfile.TemporaryDirectory() as warm:  # lazy imports (runner registry, ...) once, not in every writer
    DeviceStore(warm).install(Bundle.open(sys.argv[1]))

for line in sys.stdin:
    req = json.loads(line)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        try:
            def hook(step, kill_at=req["kill_at"]):
                if step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            for p in req["before"]:
                DeviceStore(req["root"]).install(Bundle.open(p))
            store = DeviceStore(req["root"], on_step=hook)
            os.write(ready_w, b"1")
            if req["op"] == "rollback":
                store.rollback()
            else:
                store.install(Bundle.open(req["op"]))
        except BaseException as e:
            sys.stderr.write(f"writer failed: {e!r}\n")
            sys.stderr.flush()
            os._exit(3)
        os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    if req["kill_after_s"] is not None:
        time.sleep(req["kill_after_s"])
        os.kill(pid, signal.SIGKILL)  # a zombie takes the signal quietly if it finished first
    _, status = os.waitpid(pid, 0)
    print(json.dumps(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), flush=True)
"""


class KillServer:
    """``run(root, op, kill_at, before)``: the writer's exit status (``-SIGKILL`` when killed)."""

    def __init__(self, warm_up: Path) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", KILL_SERVER, str(warm_up)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, root: Path, op: str, kill_at: str, before: list[Path], kill_after_s: float | None = None) -> int:
        import signal

        assert self.proc.stdin is not None and self.proc.stdout is not None
        req = {
            "root": str(root),
            "op": op,
            "kill_at": kill_at,
            "before": [str(p) for p in before],
            "kill_after_s": kill_after_s,
        }
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("the kill server died")
        rc = int(json.loads(line))
        if rc not in (0, -signal.SIGKILL):
            raise AssertionError(f"the writer failed ({rc}); see stderr")
        return rc

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
