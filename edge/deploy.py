"""Ship bundles to a device store and switch them atomically; deploy = convert + verify + bench + ship.

A device store is a directory (local, or remote through ssh/rsync)::

    bundles/<bundle-id>/   one directory per shipped bundle
    current -> bundles/<id>   symlink, replaced atomically (rename over it)
    previous -> bundles/<id>  what ``rollback`` switches back to
    history.jsonl           one line per switch
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

from edge.bundle import Bundle
from edge.errors import BudgetError, DeployError

CURRENT, PREVIOUS, BUNDLES, HISTORY = "current", "previous", "bundles", "history.jsonl"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _symlink_atomic(link: Path, target: str) -> None:
    tmp = link.parent / f".{link.name}.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)  # rename(2) over the old link: readers see old or new, never neither


class DeviceStore:
    """A local directory acting as a device's bundle store."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _target_of(self, name: str) -> str | None:
        link = self.root / name
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    @property
    def current(self) -> str | None:
        return self._target_of(CURRENT)

    @property
    def previous(self) -> str | None:
        return self._target_of(PREVIOUS)

    def bundle(self, which: str = CURRENT) -> Bundle:
        bid = self._target_of(which)
        if bid is None:
            raise DeployError(f"device store {self.root} has no {which} bundle")
        return Bundle.open(self.root / BUNDLES / bid)

    def install(self, bundle: Bundle) -> Path:
        """Copy ``bundle`` in (staged, verified, renamed) and make it current; the old current becomes previous."""
        bundles = self.root / BUNDLES
        bundles.mkdir(parents=True, exist_ok=True)
        dest = bundles / bundle.id
        if not dest.exists():
            stage = Path(tempfile.mkdtemp(prefix=f".{bundle.id}.partial-", dir=bundles))
            try:
                shutil.copytree(bundle.path, stage, dirs_exist_ok=True)
                Bundle.open(stage)  # verify what landed, not what was sent
                os.replace(stage, dest)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
        else:
            Bundle.open(dest)
        self._switch(bundle.id, "deploy")
        return dest

    def _switch(self, bundle_id: str, action: str) -> None:
        old = self.current
        if old == bundle_id:
            self._log(action, bundle_id, old, note="already current")
            return
        _symlink_atomic(self.root / CURRENT, f"{BUNDLES}/{bundle_id}")
        if old is not None:
            _symlink_atomic(self.root / PREVIOUS, f"{BUNDLES}/{old}")
        self._log(action, bundle_id, old)

    def rollback(self) -> str:
        if not self.root.is_dir():
            raise DeployError(f"device store {self.root} does not exist", hint="check --device; `edgekit deploy` "
                              "creates a store")
        prev = self.previous
        if prev is None:
            raise DeployError(f"device store {self.root} has no previous bundle to roll back to")
        Bundle.open(self.root / BUNDLES / prev)
        self._switch(prev, "rollback")
        return prev

    def _log(self, action: str, new: str, old: str | None, note: str = "") -> None:
        entry = {"time": _now(), "action": action, "current": new, "replaced": old}
        if note:
            entry["note"] = note
        with open(self.root / HISTORY, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def history(self) -> list[dict[str, Any]]:
        f = self.root / HISTORY
        return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


class SshStore:
    """A device store on another machine, driven through the system's ssh and rsync."""

    def __init__(self, url: str, ssh: Sequence[str] = ("ssh", "-o", "BatchMode=yes")) -> None:
        u = urlparse(url)
        if u.scheme != "ssh" or not u.hostname or not u.path:
            raise DeployError(f"bad device URL {url!r}", hint="use ssh://user@host/path/to/store")
        self.dest = f"{u.username + '@' if u.username else ''}{u.hostname}"
        self.port = u.port
        self.root = u.path
        self.ssh = [*ssh, *(["-p", str(u.port)] if u.port else [])]
        for tool in ("ssh", "rsync"):
            if shutil.which(tool) is None:
                raise DeployError(f"shipping to {url} needs '{tool}' on PATH", hint=f"install {tool} (apt-get install {'openssh-client' if tool == 'ssh' else tool})")

    def _run(self, args: list[str]) -> str:
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            raise DeployError(f"{shlex.join(args[:3])}... failed ({p.returncode}): {p.stderr.strip()[:300]}")
        return p.stdout

    def _remote(self, script: str) -> str:
        return self._run([*self.ssh, self.dest, script])

    def install(self, bundle: Bundle) -> str:
        root = shlex.quote(self.root)
        bid = shlex.quote(bundle.id)
        self._remote(f"mkdir -p {root}/{BUNDLES}")
        stage = f"{self.root}/{BUNDLES}/.{bundle.id}.partial"
        self._run(["rsync", "-a", "--delete", "-e", shlex.join(self.ssh), f"{bundle.path}/", f"{self.dest}:{stage}/"])
        # verify on the far side with sha256sum, then rename and switch the symlink atomically
        sums = "\n".join(f"{a['sha256']}  {a['path']}" for a in bundle.manifest["artifacts"])
        self._remote(
            f"cd {shlex.quote(stage)} && {{ printf %s {shlex.quote(sums + chr(10))} | sha256sum -c --quiet - "
            f"|| {{ cd / && rm -rf {shlex.quote(stage)}; echo 'bundle failed sha256 verification on the device' >&2; exit 1; }}; }} && cd {root} && "
            f"{{ [ -d {BUNDLES}/{bid} ] && rm -rf {shlex.quote(stage)} || mv {shlex.quote(stage)} {BUNDLES}/{bid}; }} && "
            f"old=$(readlink {CURRENT} 2>/dev/null || true) && "
            f"ln -sfn {BUNDLES}/{bid} .{CURRENT}.tmp && mv -T .{CURRENT}.tmp {CURRENT} && "
            f"if [ -n \"$old\" ] && [ \"$old\" != {BUNDLES}/{bid} ]; then ln -sfn \"$old\" .{PREVIOUS}.tmp && mv -T .{PREVIOUS}.tmp {PREVIOUS}; fi && "
            f"printf '%s\\n' \"{{\\\"time\\\": \\\"$(date -u +%FT%T+00:00)\\\", \\\"action\\\": \\\"deploy\\\", \\\"current\\\": \\\"{bundle.id}\\\"}}\" >> {HISTORY}"
        )
        return f"{self.dest}:{self.root}/{BUNDLES}/{bundle.id}"

    def rollback(self) -> str:
        root = shlex.quote(self.root)
        out = self._remote(
            f"cd {root} && prev=$(readlink {PREVIOUS}) && cur=$(readlink {CURRENT}) && "
            f"ln -sfn \"$prev\" .{CURRENT}.tmp && mv -T .{CURRENT}.tmp {CURRENT} && "
            f"ln -sfn \"$cur\" .{PREVIOUS}.tmp && mv -T .{PREVIOUS}.tmp {PREVIOUS} && basename \"$prev\"")
        return out.strip()


SSH_OPTIONS_ENV = "EDGEKIT_SSH_OPTIONS"


def open_store(device: str | os.PathLike[str]) -> DeviceStore | SshStore:
    """A local directory, or ``ssh://user@host[:port]/path`` (extra ssh options from $EDGEKIT_SSH_OPTIONS)."""
    d = str(device)
    if d.startswith("ssh://"):
        extra = shlex.split(os.environ.get(SSH_OPTIONS_ENV, ""))
        return SshStore(d, ssh=("ssh", "-o", "BatchMode=yes", *extra))
    if "://" in d:
        raise DeployError(f"unsupported device address {d!r}", hint="use a local directory or ssh://user@host/path")
    return DeviceStore(d)


def rollback(device: str | os.PathLike[str]) -> str:
    """Make the previous bundle current again; returns its id."""
    return open_store(device).rollback()


@dataclass
class DeployResult:
    bundle: Bundle
    shipped_to: str
    benchmark: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"bundle_id": self.bundle.id, "bundle_path": str(self.bundle.path), "shipped_to": self.shipped_to,
                "parity": self.bundle.manifest.get("parity"), "benchmark": self.benchmark, "notes": self.notes}


def ship(bundle: Bundle | str | os.PathLike[str], device: str | os.PathLike[str], *,
         accept_parity_failure: bool = False, accept_budget_failure: bool = False) -> str:
    """Verify ``bundle`` and install it as the device's current bundle. Refuses failed gates."""
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    b.verify()
    parity = b.manifest.get("parity") or {}
    if parity.get("passed") is False and not accept_parity_failure:
        raise DeployError(f"refusing to ship {b.id}: it failed parity", hint="pass --accept-parity-failure to ship it anyway")
    bench = b.manifest.get("benchmark") or {}
    if bench.get("verdict") == "fail" and bench.get("on_target_device") and not accept_budget_failure:
        raise BudgetError(f"refusing to ship {b.id}: p99 {bench['latency']['p99_ms']:.2f} ms is over the "
                          f"{bench['budget_ms']:.2f} ms budget ({bench['budget_source']})",
                          hint="pass --accept-budget-failure to ship it anyway")
    store = open_store(device)
    where = store.install(b)
    return str(where)


def deploy(model: str | os.PathLike[str], target: str, device: str | os.PathLike[str], *,
           build_dir: str | os.PathLike[str] | None = None, bench_iterations: int = 200,
           fps: float | None = None, budget_ms: float | None = None,
           accept_parity_failure: bool = False, accept_budget_failure: bool = False, allow_cpu_fallback: bool = False,
           on_step: Callable[[str], None] | None = None, **convert_kwargs: Any) -> DeployResult:
    """Convert + parity + benchmark (on this host when the target runtime runs here) + ship."""
    from edge.bench import run_benchmark
    from edge.convert import convert
    from edge.stats import budget_from
    from edge.targets import get_target

    say = on_step or (lambda _m: None)
    profile = get_target(target, convert_kwargs.get("targets_dir", ()))
    open_store(device)  # a bad address, or no ssh/rsync, fails here: before minutes of work, with nothing built
    build = Path(build_dir) if build_dir else Path("build") / f"{Path(model).stem}-{target}"
    bundle = convert(model, profile, build, accept_parity_failure=accept_parity_failure, on_step=say, force=True,
                     **convert_kwargs)
    notes: list[str] = []
    report = None
    if bundle.manifest["parity"].get("skipped"):
        notes.append(f"benchmark skipped: {bundle.manifest['parity']['skipped']}")
    else:
        budget, source = budget_from(fps, budget_ms, profile.frame_budget_ms)
        say(f"benchmarking {bench_iterations} iterations on this host")
        extra = {"allow_cpu_fallback": True} if allow_cpu_fallback else {}
        rep = run_benchmark(lambda: bundle.open_runner(extra), iterations=bench_iterations, budget_ms=budget, budget_source=source,
                            bundle=bundle.id, target=profile.name)
        rep.on_target_device = rep.runner.get("fallback") is None
        if not rep.on_target_device:
            notes.append(f"benchmark ran on this host's fallback device ({rep.runner['fallback']}); "
                         "its budget verdict is indicative and does not gate the deploy")
        report = rep.to_json()
        bundle.record("benchmark", report)
    say(f"shipping {bundle.id} to {device}")
    where = ship(bundle, device, accept_parity_failure=accept_parity_failure, accept_budget_failure=accept_budget_failure)
    return DeployResult(bundle, where, report, notes)
