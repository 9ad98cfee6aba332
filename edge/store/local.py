"""A device store in a local directory (the device's own disk, or a mount)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from edge.base.typedjson import write_json_atomic
from edge.errors import DeployError, EdgeError
from edge.store.base import (
    ALREADY_NOTE,
    BUNDLES,
    CURRENT,
    DEFAULT_LOCK_TIMEOUT_S,
    HISTORY,
    INTENT,
    LOCK,
    PARTIAL,
    PREVIOUS,
    RECOVERED_NOTE,
    Intent,
    StepHook,
    Store,
    StoreState,
    bundle_files,
    check_bundle_id,
    damaged,
    history_entry,
    history_line,
    is_bundle_id,
    link_kind_message,
    link_target_id,
    now_iso,
    parse_history,
    state_of,
    with_pending,
)

#: ``checks/<bundle-id>.json``: the latest reference check of that bundle on this device (``edge.verify.refpairs``)
CHECKS = "checks"
MAX_CHECK_BYTES = 1 << 20


def new_txn() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}-{secrets.token_hex(4)}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def symlink_atomic(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` by renaming a new symlink over it: readers see old or new, never neither."""
    tmp = link.parent / f".{link.name}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    _fsync_dir(link.parent)


class DeviceStore(Store):
    """A local directory acting as a device's bundle store (layout and protocol: ``edge.store.base``).

    ``on_step`` is called with each step's name (``INSTALL_STEPS``) just before the step runs: progress
    reporting, and the fault-injection tests that kill a writer at every step.

    ``trust``: the device's trust store (``edge.bundle.trust``); default ``$EDGEKIT_TRUST_DIR``, else the
    store's own ``trust/`` when it exists. With one, ``install`` admits only what it vouches for --
    checked on the copy that landed, under the lock, where the version seen is recorded -- and
    ``bundle`` opens only what it vouches for. Without one nothing is checked (logged at info level).

    ``checks/<bundle-id>.json`` holds the latest reference check of each bundle run here
    (``edge.verify.refpairs``), so a second load does not check again; written by rename, outside the
    writers' lock (one file per bundle, whole or absent).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
        on_step: StepHook | None = None,
        trust: Any = None,
    ) -> None:
        from edge.bundle.trust import resolve_trust

        self.root = Path(root)
        self.where = str(self.root)
        self.lock_timeout = lock_timeout
        self._on_step = on_step
        self.trust = resolve_trust(trust, self.root) if trust is not False else None

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    # reading -----------------------------------------------------------------------------------
    def _link(self, name: str) -> str | None:
        p = self.root / name
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return link_target_id(self.where, name, os.readlink(p))
        raise damaged(self.where, link_kind_message(name, "dir" if stat.S_ISDIR(st.st_mode) else "file"))

    def _intent(self) -> Intent | None:
        p = self.root / INTENT
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            raise damaged(self.where, f"'{INTENT}' is not an intent record")
        try:
            return Intent.parse(self.where, p.read_text(encoding="utf-8"))
        except FileNotFoundError:  # the writer finished meanwhile
            return None
        except UnicodeDecodeError:
            raise damaged(self.where, f"'{INTENT}' is not an intent record") from None

    def state(self) -> StoreState:
        with self._guard():
            if not self.root.exists():
                return StoreState(None, None)
            if not self.root.is_dir():
                raise DeployError(f"device store {self.where} is not a directory")
            for _ in range(20):  # a writer may move things between our reads: read until two agree
                intent = self._intent()
                current, previous = self._link(CURRENT), self._link(PREVIOUS)
                if self._intent() == intent and self._link(CURRENT) == current:
                    return state_of(intent, current, previous)
            return state_of(intent, current, previous)

    def bundle(self, which: str = CURRENT) -> Any:
        """The current (or previous) bundle, opened and verified."""
        from edge.bundle.bundle import Bundle

        st = self.state()
        bid = st.current if which == CURRENT else st.previous
        if bid is None:
            raise DeployError(f"device store {self.where} has no {which} bundle")
        return Bundle.open(self.root / BUNDLES / bid, trust=self.trust or False)

    def history(self) -> list[dict[str, Any]]:
        with self._guard():
            f = self.root / HISTORY
            if f.is_symlink() or (f.exists() and not f.is_file()):
                raise damaged(self.where, f"'{HISTORY}' is not a file")
            entries = parse_history(f.read_text(encoding="utf-8", errors="replace")) if f.exists() else []
        return with_pending(entries, self.state())

    # reference checks (edge.verify.refpairs) --------------------------------------------------------------
    def reference_check(self, bundle_id: str) -> dict[str, Any] | None:
        """The recorded reference check of ``bundle_id`` on this device; None when there is none, or
        when the record is not one (too big, not JSON, another bundle's): the bundle is then checked again."""
        f = self.root / CHECKS / f"{check_bundle_id(bundle_id)}.json"
        try:
            fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # absent, a symlink, unreadable: no usable record
            return None
        with os.fdopen(fd, "rb") as h:
            if not stat.S_ISREG(os.fstat(h.fileno()).st_mode):
                return None
            data = h.read(MAX_CHECK_BYTES + 1)
        try:
            rec = json.loads(data) if len(data) <= MAX_CHECK_BYTES else None
        except ValueError:
            return None
        return rec if isinstance(rec, dict) and rec.get("bundle_id") == bundle_id else None

    def record_reference_check(self, bundle_id: str, result: Any) -> Path:
        """Write ``checks/<bundle_id>.json`` (temporary file, fsync, rename, fsync the directory)."""

        bid = check_bundle_id(bundle_id)
        with self._guard():
            if not self.root.is_dir():
                raise DeployError(f"device store {self.where} does not exist")
            d = self.root / CHECKS
            if d.is_symlink() or (d.exists() and not d.is_dir()):
                raise damaged(self.where, f"'{CHECKS}' is not a directory")
            d.mkdir(exist_ok=True)
            f = d / f"{bid}.json"
            write_json_atomic(f, dict(result))
            _fsync_dir(d)
        return f

    # writing -----------------------------------------------------------------------------------
    @contextmanager
    def _guard(self) -> Iterator[None]:
        """OS errors become one line naming the store (permissions, a full disk, a vanished mount)."""
        try:
            yield
        except EdgeError:
            raise
        except OSError as e:
            what = f" ({e.filename})" if e.filename else ""
            raise DeployError(f"device store {self.where}: {e.strerror or e}{what}") from None

    @contextmanager
    def _locked(self, *, create: bool) -> Iterator[None]:
        if create:
            if self.root.exists() and not self.root.is_dir():
                raise DeployError(f"device store {self.where} is not a directory")
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise DeployError(
                f"device store {self.where} does not exist", hint="check --device; `edgekit deploy` creates a store"
            )
        lock = self.root / LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR):
                raise damaged(self.where, f"'{LOCK}' is not a file") from None
            raise
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                        raise DeployError(
                            f"device store {self.where} is busy: another deploy or rollback (pid {holder}) has "
                            f"held its lock for over {self.lock_timeout:g} s",
                            hint="wait for it to finish, then run this again",
                        ) from None
                    time.sleep(0.02)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
            self._step("unlock")
        finally:
            os.close(fd)  # releases the flock (so does the kernel, when a writer is killed)

    def _set_link(self, name: str, bid: str | None) -> None:
        if bid is None:
            (self.root / name).unlink(missing_ok=True)
            _fsync_dir(self.root)
        else:
            symlink_atomic(self.root / name, f"{BUNDLES}/{bid}")

    def _append_history(self, entry: dict[str, Any]) -> None:
        f = self.root / HISTORY
        with open(f, "ab") as out:
            torn = out.tell() > 0 and _last_byte(f) != b"\n"  # a line cut by a power loss stays alone
            out.write((b"\n" if torn else b"") + history_line(entry).encode())
            out.flush()
            os.fsync(out.fileno())

    def _history_has(self, txn: str) -> bool:
        f = self.root / HISTORY
        if not f.exists():
            return False
        with open(f, "rb") as h:
            h.seek(max(0, f.stat().st_size - 8192))
            lines = [ln for ln in h.read().splitlines() if ln.strip()]
        return bool(lines) and f'"txn": "{txn}"'.encode() in lines[-1]

    def _recover(self) -> None:
        """Finish or undo a switch a killed writer left; remove staging leftovers. Runs under the lock."""
        intent = self._intent()
        if intent is not None:
            current, previous = self._link(CURRENT), self._link(PREVIOUS)
            want = state_of(intent, current, previous)
            if previous != want.previous:
                self._set_link(PREVIOUS, want.previous)
            if want.switched and not self._history_has(intent.txn):
                self._append_history(
                    history_entry(intent.action, intent.new, intent.old, intent.txn, intent.time, RECOVERED_NOTE)
                )
            (self.root / INTENT).unlink()
            _fsync_dir(self.root)
        bundles = self.root / BUNDLES
        if bundles.is_symlink() or (bundles.exists() and not bundles.is_dir()):
            raise damaged(self.where, f"'{BUNDLES}' is not a directory")
        for leftover in [
            *(bundles.glob(".*") if bundles.exists() else ()),
            *self.root.glob(f".{CURRENT}.tmp*"),
            *self.root.glob(f".{PREVIOUS}.tmp*"),
            *self.root.glob(f"{INTENT}.tmp*"),
        ]:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink(missing_ok=True)
        h = self.root / HISTORY
        if h.is_symlink() or (h.exists() and not h.is_file()):
            raise damaged(self.where, f"'{HISTORY}' is not a file")

    def _switch(self, new: str, action: str) -> None:
        current, previous = self._link(CURRENT), self._link(PREVIOUS)
        time_ = now_iso()
        if current == new:
            self._step("commit")
            self._append_history(history_entry(action, new, current, new_txn(), time_, ALREADY_NOTE))
            return
        intent = Intent(new_txn(), action, new, current, previous, current if current is not None else previous, time_)
        self._step("intent")
        tmp = self.root / f"{INTENT}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(intent.line())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / INTENT)
        _fsync_dir(self.root)
        self._step("previous")
        if intent.previous_after != previous:
            self._set_link(PREVIOUS, intent.previous_after)
        self._step("current")
        self._set_link(CURRENT, new)
        self._step("commit")
        self._append_history(history_entry(action, new, current, intent.txn, time_))
        self._step("finish")
        (self.root / INTENT).unlink()  # unsynced on purpose: an intent back after a power cut resolves the same

    def _present(self, dest: Path, bid: str, src: Path) -> bool:
        """``bundles/<id>`` is there, verifies, and has the same manifest and signature as ``src`` (a bundle
        signed or re-signed since it was last shipped replaces its old copy); otherwise it is moved aside
        (and removed) to be replaced."""
        from edge.bundle.bundle import MANIFEST, SIGNATURE, Bundle

        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            try:
                if Bundle.open(dest, trust=False).id == bid and all(
                    _same_file(dest / name, src / name) for name in (MANIFEST, SIGNATURE)
                ):
                    return True
            except EdgeError:
                pass
        aside = dest.parent / f"{PARTIAL}damaged-{secrets.token_hex(4)}"
        os.rename(dest, aside)
        _fsync_dir(dest.parent)
        shutil.rmtree(aside) if aside.is_dir() and not aside.is_symlink() else aside.unlink()
        return False

    def _stage(self, src: Path, bundles: Path, bid: str) -> Path:
        from edge.bundle.bundle import Bundle

        self._step("stage")
        files = list(bundle_files(src))  # refuses links and devices before anything is written
        stage = bundles / f"{PARTIAL}{secrets.token_hex(8)}"
        stage.mkdir()
        first = True
        for rel, path, is_dir in files:
            out = stage / rel
            if is_dir:
                out.mkdir()
                continue
            with open(path, "rb") as i, open(out, "xb") as o:
                shutil.copyfileobj(i, o, 1 << 20)
                os.fsync(o.fileno())
            if first:
                self._step("copy")
                first = False
        self._step("fsync")
        for d in sorted({stage, *(stage / rel for rel, _, is_dir in files if is_dir)}, key=lambda p: -len(p.parts)):
            _fsync_dir(d)
        self._step("verify")
        landed = Bundle.open(stage, trust=False)  # what landed, not what was sent
        if landed.id != bid:
            raise DeployError(f"bundle {src} changed while it was copied (now {landed.id})")
        return stage

    def install(self, bundle: Any) -> Path:
        bid = check_bundle_id(bundle.id)
        with self._guard(), self._locked(create=True):
            self._step("recover")
            self._recover()
            bundles = self.root / BUNDLES
            bundles.mkdir(exist_ok=True)
            dest = bundles / bid
            admitted = None
            if not self._present(dest, bid, Path(bundle.path)):
                stage = self._stage(Path(bundle.path), bundles, bid)
                try:
                    admitted = self._admit(stage)
                except BaseException:
                    shutil.rmtree(stage, ignore_errors=True)
                    raise
                self._step("rename")
                os.rename(stage, dest)  # dest is absent: we hold the lock and checked
                _fsync_dir(bundles)
            else:
                admitted = self._admit(dest)  # what will run is the copy already here: it must pass too
            self._switch(bid, "deploy")
            if admitted is not None and self.trust is not None:
                self.trust.record(admitted, bid)
        return dest

    def _admit(self, path: Path) -> Any:
        """The trust store's verdict on the bundle at ``path`` (None without a trust store)."""
        if self.trust is None:
            return None
        from edge.bundle.bundle import Bundle

        return self.trust.check(Bundle.open(path, trust=False))

    def rollback(self) -> str:
        from edge.bundle.bundle import Bundle

        if self.root.is_dir() and self.state().previous is None:  # refused without taking the lock: nothing written
            raise DeployError(f"device store {self.where} has no previous bundle to roll back to")
        with self._guard(), self._locked(create=False):
            self._step("recover")
            self._recover()
            prev = self._link(PREVIOUS)
            if prev is None:
                raise DeployError(f"device store {self.where} has no previous bundle to roll back to")
            back = Bundle.open(self.root / BUNDLES / prev, trust=False)
            admitted = None
            if self.trust is not None:  # the operator may go back a version, not to a revoked key's bundle
                admitted = self.trust.check(back, older_ok=True)
            self._switch(prev, "rollback")
            if admitted is not None and self.trust is not None:
                self.trust.allow(admitted, prev)
        return prev


def store_holding(bundle_path: str | os.PathLike[str]) -> DeviceStore | None:
    """The device store a bundle directory lies in (``<store>/bundles/<id>``, also when reached through
    ``current`` or ``previous``), opened for its records only; None for a bundle anywhere else."""
    try:
        p = Path(bundle_path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    root = p.parent.parent
    if p.parent.name != BUNDLES or not is_bundle_id(p.name):
        return None
    if not any((root / n).is_symlink() for n in (CURRENT, PREVIOUS)) and not (root / HISTORY).is_file():
        return None
    return DeviceStore(root, trust=False)


def _same_file(a: Path, b: Path) -> bool:
    """Both absent, or both regular files with the same bytes (manifests and signatures: a few kB)."""
    try:
        return a.read_bytes() == b.read_bytes()
    except FileNotFoundError:
        return not a.exists() and not b.exists()
    except OSError:
        return False


def _last_byte(f: Path) -> bytes:
    with open(f, "rb") as h:
        h.seek(-1, os.SEEK_END)
        return h.read(1)
