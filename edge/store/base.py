"""What every device store shares: the on-disk layout, the switch protocol, the ``Store`` interface.

A device store is one directory, the same whether it is reached as a local path or over ssh
(either implementation takes over a store the other wrote; both write byte-identical records)::

    bundles/<bundle-id>/      one directory per shipped bundle, named so only once complete and verified
    bundles/.partial-*        a bundle being staged; every dot-entry under bundles/ is a leftover
    current -> bundles/<id>   symlink, replaced by rename: what the agent runs
    previous -> bundles/<id>  what ``rollback`` switches to
    history.jsonl             one JSON line per completed switch
    .intent                   the switch in progress (a write-ahead record), removed when it completes
    .lock                     the writers' lock (flock), held for a whole install or rollback

An install or rollback runs, under the lock, in this order (each step durable before the next:
files and directories are fsynced, ``sync`` on the device)::

    recover   finish or undo a switch a killed writer left behind (``.intent``); remove leftovers
    stage     copy into bundles/.partial-<random>, fsync, verify every sha256
    rename    bundles/.partial-<random> -> bundles/<id>  (a bundle directory is never half there)
    intent    write .intent: "v1 txn action new old previous-before previous-after time" (tmp + rename)
    previous  previous -> the old current  (symlink renamed over the old one)
    current   current -> the new bundle    (the commit point)
    commit    append the history line (it carries the txn, so recovery never writes it twice)
    finish    remove .intent

Why a kill (SIGKILL, or a power cut given the syncs) at any point leaves a good store:

- ``current`` only ever changes by one rename, to a directory that was complete and verified before
  it got its name: it always names a whole bundle.
- Until ``current`` moves, the switch has not happened; after, it has. ``.intent`` records both
  outcomes' ``previous``, so recovery (the next writer, under the lock) sets ``previous`` to the
  one matching ``current`` and writes the history line if it is missing. Readers take no lock: they
  read ``.intent`` with the links and report the state recovery will produce (``state_of``), so
  ``rollback`` after a kill goes to the bundle deployed before ``current`` — never one further back.
- ``previous`` moves before ``current``: with no recovery at all the worst state is
  previous == current (a rollback that changes nothing), never previous = two deploys back.
- Staging leftovers carry a dot-name no bundle id may have, and are removed under the lock, when
  no other writer can be using them.

Why not one ``state.json`` switched by rename: the agent, scripts and people read ``current`` as a
symlink (``readlink``, ``cd current``); a state file would either replace that or duplicate it as a
second truth. The intent record gives the same all-or-nothing switch with the symlink itself as
the commit point.
"""

from __future__ import annotations

import json
import os
import re
import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from edge.base.hashing import sha256_file
from edge.bundle.schema import ID
from edge.errors import DeployError

CURRENT, PREVIOUS, BUNDLES, HISTORY = "current", "previous", "bundles", "history.jsonl"
INTENT, LOCK, PARTIAL = ".intent", ".lock", ".partial-"
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
INTENT_VERSION = "v1"
DEFAULT_LOCK_TIMEOUT_S = 300

# Where a writer can be killed, in order (``on_step`` is called with each name just before that step).
INSTALL_STEPS = (
    "recover",
    "stage",
    "copy",
    "fsync",
    "verify",
    "rename",
    "intent",
    "previous",
    "current",
    "commit",
    "finish",
    "unlock",
)
SWITCH_STEPS = ("intent", "previous", "current", "commit", "finish", "unlock")

StepHook = Callable[[str], None]

_ID = re.compile(ID)  # the manifest's own id rule: one definition
_TXN = re.compile(r"[A-Za-z0-9-]{1,80}")
_TIME = re.compile(r"[0-9T:+.-]{1,40}")


def _show(value: object) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def check_bundle_id(bundle_id: object) -> str:
    """``bundle_id`` when a store may use it as a directory name; refused before anything else happens.

    The manifest's rule (``[A-Za-z0-9._-]{1,128}``, not starting with '.' or '-'), checked again here
    because the store must not depend on every caller having validated: a name starting with '.' is
    the store's own staging space, and '.'/'..' would leave bundles/.
    """
    if not isinstance(bundle_id, str) or not _ID.fullmatch(bundle_id):
        raise DeployError(
            f"refusing bundle id {_show(bundle_id)}: a bundle id is 1-128 characters from "
            "A-Z a-z 0-9 . _ - and starts with neither '.' nor '-'",
            hint="rebuild the bundle with `edgekit convert`",
        )
    return bundle_id


def is_bundle_id(value: str) -> bool:
    try:
        check_bundle_id(value)
    except DeployError:
        return False
    return True


def check_artifact_path(path: object) -> str:
    """A path inside a bundle that is safe to name in a checksum list: relative, no '..', no control characters."""
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\\" in path
        or any(ord(c) < 32 or ord(c) == 127 for c in path)
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise DeployError(
            f"refusing artifact path {_show(path)}: not a plain relative path inside the bundle",
            hint="rebuild the bundle with `edgekit convert`",
        )
    return path


def damaged(where: str, what: str) -> DeployError:
    return DeployError(
        f"device store {where} is damaged: {what}",
        hint="move the damaged entry away; a store holds bundles/<id>/, the links current and previous -> bundles/<id>, history.jsonl",
    )


def link_kind_message(name: str, kind: str, target: str = "") -> str:
    """One wording for a damaged link, whichever side (local or device) found it."""
    if kind == "dir":
        return f"'{name}' is a directory, not a link to bundles/<id>"
    if kind == "file":
        return f"'{name}' is a file, not a link to bundles/<id>"
    return f"'{name}' points to {_show(target)}, not to bundles/<id>"


def link_target_id(where: str, name: str, target: str) -> str:
    bid = target[len(BUNDLES) + 1 :] if target.startswith(BUNDLES + "/") else ""
    if not is_bundle_id(bid):
        raise damaged(where, link_kind_message(name, "badlink", target))
    return bid


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Intent:
    """The switch in progress: enough to finish it or undo it (``-`` in the file means none)."""

    txn: str
    action: str
    new: str
    old: str | None
    previous_before: str | None
    previous_after: str | None
    time: str

    def line(self) -> str:
        f = [
            INTENT_VERSION,
            self.txn,
            self.action,
            self.new,
            self.old or "-",
            self.previous_before or "-",
            self.previous_after or "-",
            self.time,
        ]
        return " ".join(f) + "\n"

    @classmethod
    def parse(cls, where: str, text: str) -> Intent:
        fields = text.strip("\n").split(" ")
        opt = [None if f == "-" else f for f in fields[4:7]] if len(fields) == 8 else []
        if (
            len(fields) != 8
            or fields[0] != INTENT_VERSION
            or not _TXN.fullmatch(fields[1])
            or fields[2] not in ("deploy", "rollback")
            or not is_bundle_id(fields[3])
            or any(o is not None and not is_bundle_id(o) for o in opt)
            or not _TIME.fullmatch(fields[7])
        ):
            raise damaged(where, f"'{INTENT}' is not an intent record: {_show(text[:120])}")
        return cls(fields[1], fields[2], fields[3], opt[0], opt[1], opt[2], fields[7])


def history_entry(
    action: str, current: str, replaced: str | None, txn: str, time: str, note: str = ""
) -> dict[str, Any]:
    """A history line; the device script prints the same keys in the same order (byte-identical lines)."""
    entry: dict[str, Any] = {"time": time, "action": action, "current": current, "replaced": replaced, "txn": txn}
    if note:
        entry["note"] = note
    return entry


def history_line(entry: Mapping[str, Any]) -> str:
    return json.dumps(entry) + "\n"


def parse_history(text: str) -> list[dict[str, Any]]:
    """Entries of history.jsonl; a line torn by a power cut (or any non-object line) is skipped."""
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


@dataclass(frozen=True)
class StoreState:
    """What a store runs now and what ``rollback`` would switch to, as recovery will leave them."""

    current: str | None
    previous: str | None
    pending: Intent | None = None  # a switch a writer is doing, or was killed doing

    @property
    def switched(self) -> bool:
        return self.pending is not None and self.current == self.pending.new


def state_of(intent: Intent | None, current: str | None, previous: str | None) -> StoreState:
    """Interpret raw facts (the intent record and the two links) the way recovery resolves them."""
    if intent is None:
        return StoreState(current, previous)
    if current == intent.new:
        return StoreState(current, intent.previous_after, intent)
    return StoreState(current, intent.previous_before, intent)


def with_pending(entries: list[dict[str, Any]], state: StoreState) -> list[dict[str, Any]]:
    """History as recovery will leave it: a switch that happened but has no line yet is shown (noted)."""
    p = state.pending
    if p is not None and state.switched and not (entries and entries[-1].get("txn") == p.txn):
        entries = [*entries, history_entry(p.action, p.new, p.old, p.txn, p.time, RECOVERED_NOTE)]
    return entries


RECOVERED_NOTE = "completed after an interruption"
ALREADY_NOTE = "already current"


class Store(ABC):
    """A device's bundle store. Writers (``install``, ``rollback``) hold the store's lock; readers take none."""

    where: str  # how messages name the store
    trust: Any = None  # the edge.bundle.trust.TrustStore that must vouch for what is installed; None: nothing checked

    @abstractmethod
    def state(self) -> StoreState:
        """The current and previous bundle ids (as recovery of an interrupted switch will leave them)."""

    @property
    def current(self) -> str | None:
        return self.state().current

    @property
    def previous(self) -> str | None:
        return self.state().previous

    @abstractmethod
    def install(self, bundle: Any) -> Any:
        """Copy ``bundle`` in (staged, verified, renamed) and make it current; the old current becomes previous."""

    @abstractmethod
    def rollback(self) -> str:
        """Make the previous bundle current again (the current one becomes previous); returns its id."""

    @abstractmethod
    def history(self) -> list[dict[str, Any]]:
        """One entry per completed switch, oldest first."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Nothing is held between calls (locks and connections live for one operation); kept for ``with``."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bundle_files(root: Any) -> Iterator[tuple[str, Any, bool]]:
    """(relative path, path, is_dir) for everything in a bundle directory, parents first.

    Only regular files and directories travel: a symlink, device or socket is refused, so a bundle
    cannot make the store copy something from outside it.
    """
    base = Path(root)
    for dirpath, dirnames, filenames in os.walk(base):
        d = Path(dirpath)
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            p = d / name
            st = os.lstat(p)
            rel = p.relative_to(base).as_posix()
            if stat.S_ISDIR(st.st_mode):
                yield rel, p, True
            elif stat.S_ISREG(st.st_mode):
                yield rel, p, False
            else:
                raise DeployError(
                    f"refusing to ship {base}: {rel} is not a regular file or directory",
                    hint="a bundle holds only plain files; rebuild it with `edgekit convert`",
                )


def checksum_args(bundle: Any) -> list[str]:
    """sha256/path pairs for the device to check: every listed artifact, and the manifest file itself."""

    pairs: list[str] = []
    for a in _artifacts(bundle):
        sha = a.get("sha256") if isinstance(a, Mapping) else getattr(a, "sha256", None)
        path = a.get("path") if isinstance(a, Mapping) else getattr(a, "path", None)
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise DeployError(
                f"refusing to ship {bundle.path}: artifact {_show(path)} has no valid sha256",
                hint="rebuild the bundle with `edgekit convert`",
            )
        pairs += [sha, check_artifact_path(path)]
    sig = Path(bundle.path) / SIGNATURE_FILE  # travels with the bundle: checked too, and a re-signed bundle
    extra = [sha256_file(sig), SIGNATURE_FILE] if sig.is_file() and not sig.is_symlink() else []  # replaces its copy
    return [*pairs, sha256_file(bundle.path / MANIFEST_FILE), MANIFEST_FILE, *extra]


def _artifacts(bundle: Any) -> Iterable[Any]:
    info = getattr(bundle, "info", None)  # the typed manifest, where the bundle has one
    arts = info.artifacts if info is not None else bundle.manifest["artifacts"]
    if not isinstance(arts, (list, tuple)):
        raise DeployError(f"refusing to ship {bundle.path}: its manifest lists no artifacts")
    return arts
