"""A device store on another machine, reached with the system's ``ssh``.

Every operation is one ssh connection running the fixed script of ``edge.store.remote`` with its
values as quoted positional arguments; an install streams the bundle as a tar on the same
connection, so the device-side lock is held from cleanup to commit.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

from edge.errors import DeployError
from edge.store.base import (
    BUNDLES,
    CURRENT,
    DEFAULT_LOCK_TIMEOUT_S,
    HISTORY,
    INTENT,
    LOCK,
    PREVIOUS,
    Intent,
    Store,
    StoreState,
    bundle_files,
    check_bundle_id,
    checksum_args,
    damaged,
    link_kind_message,
    link_target_id,
    parse_history,
    state_of,
    with_pending,
)
from edge.store.remote import REMOTE_SCRIPT

#: the most a device store may answer to one operation (a manifest, the history): past it the device is no store
MAX_ANSWER_BYTES = 16 << 20

SSH_OPTIONS_ENV = "EDGEKIT_SSH_OPTIONS"
URL_HINT = "use ssh://user@host/path/to/store (user@ and :port are optional)"

# The ssh options $EDGEKIT_SSH_OPTIONS may set: how to authenticate, which host keys to trust, timeouts and
# keep-alives, algorithms, logging. Everything else is refused: options that run a command or load code on
# this host (ProxyCommand, LocalCommand, XAuthLocation, KnownHostsCommand, PKCS11Provider, ...), that send
# the connection elsewhere than the URL names (Hostname, ProxyJump, ControlPath, User), that forward
# anything to the device (ForwardX11, ForwardAgent, LocalForward, ...) or read more configuration
# (Include, Match). An allow-list, so an option ssh adds tomorrow is refused until someone reads it.
ALLOWED_SSH_OPTIONS = {
    k.lower(): k
    for k in (
        "IdentityFile",
        "IdentitiesOnly",
        "IdentityAgent",
        "CertificateFile",
        "Port",
        "UserKnownHostsFile",
        "GlobalKnownHostsFile",
        "StrictHostKeyChecking",
        "CheckHostIP",
        "HashKnownHosts",
        "UpdateHostKeys",
        "VerifyHostKeyDNS",
        "HostKeyAlgorithms",
        "ConnectTimeout",
        "ConnectionAttempts",
        "ServerAliveInterval",
        "ServerAliveCountMax",
        "TCPKeepAlive",
        "AddressFamily",
        "IPQoS",
        "Compression",
        "RekeyLimit",
        "LogLevel",
        "Ciphers",
        "MACs",
        "KexAlgorithms",
        "PubkeyAcceptedAlgorithms",
        "PubkeyAcceptedKeyTypes",
        "CASignatureAlgorithms",
        "PreferredAuthentications",
        "PubkeyAuthentication",
        "PasswordAuthentication",
        "KbdInteractiveAuthentication",
        "NumberOfPasswordPrompts",
    )
}
SSH_OPTIONS_HINT = (
    "allowed: "
    + ", ".join(sorted(ALLOWED_SSH_OPTIONS.values(), key=str.lower))
    + "; anything else belongs in ~/.ssh/config for the host, if you mean it"
)

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]")
_PATH = re.compile(r"/[A-Za-z0-9._/~+,=@-]*")
_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]{0,63})=([^\x00-\x1f\x7f]+)")


@dataclass(frozen=True)
class SshAddress:
    user: str | None
    host: str
    port: int | None
    path: str

    @property
    def login(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host


def parse_ssh_url(url: str) -> SshAddress:
    """``ssh://[user@]host[:port]/path``, strictly: anything else is one clear line."""

    def bad(why: str) -> DeployError:
        return DeployError(f"bad device URL {url!r}: {why}", hint=URL_HINT)

    if not url.startswith("ssh://"):
        raise bad("it does not start with ssh://")
    rest = url[len("ssh://") :]
    if "#" in rest:
        raise bad("a fragment (#...) has no meaning here")
    if "?" in rest:
        raise bad("a query (?...) has no meaning here")
    if any(ord(c) < 33 or ord(c) == 127 for c in rest):
        raise bad("it holds spaces or control characters")
    authority, slash, path = rest.partition("/")
    path = slash + path
    user, at, hostport = authority.rpartition("@")
    if at and not user:
        raise bad("an empty user before '@'")
    if user.startswith("-") or hostport.startswith("-"):
        raise bad("a user or host must not start with '-'")
    if at and not _USER.fullmatch(user):
        raise bad(f"user {user!r} has characters a login name does not")
    if hostport.startswith("["):
        host, _, port_s = hostport.partition("]")
        host += "]"
        if port_s and not port_s.startswith(":"):
            raise bad("unexpected text after the IPv6 address")
        port_s = port_s[1:]
        if not _IPV6.fullmatch(host):
            raise bad(f"host {host!r} is not an IPv6 address")
        host = host[1:-1]
    else:
        host, colon, port_s = hostport.partition(":")
        if colon and not port_s:
            raise bad("an empty port after ':'")
        if not host:
            raise bad("no host")
        if not _HOST.fullmatch(host):
            raise bad(f"host {host!r} has characters a host name does not")
    port = None
    if port_s:
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise bad(f"port {port_s!r} is not a number from 1 to 65535")
        port = int(port_s)
    if path.strip("/") == "":
        raise bad("no store path after the host")
    if not _PATH.fullmatch(path):
        raise bad(f"path {path!r} has characters other than A-Z a-z 0-9 . _ / ~ + , = @ -")
    return SshAddress(user or None, host, port, path.rstrip("/") or "/")


def check_ssh_options(tokens: Sequence[str], source: str = SSH_OPTIONS_ENV) -> list[str]:
    """Only ``-o Key=Value`` pairs whose key is in ``ALLOWED_SSH_OPTIONS`` (any other is refused)."""
    out: list[str] = []
    toks = list(tokens)
    i = 0
    while i < len(toks):
        if toks[i] != "-o" or i + 1 >= len(toks):
            raise DeployError(
                f"{source}: {toks[i]!r} is not accepted; only '-o Key=Value' options are",
                hint="e.g. -o IdentityFile=/root/.ssh/id_ed25519 -o StrictHostKeyChecking=yes",
            )
        m = _OPTION.fullmatch(toks[i + 1])
        if m is None:
            raise DeployError(f"{source}: '-o {toks[i + 1]}' is not Key=Value", hint="e.g. -o ConnectTimeout=10")
        if m.group(1).lower() not in ALLOWED_SSH_OPTIONS:
            raise DeployError(
                f"{source}: ssh option {m.group(1)} is refused: only authentication, host-key, "
                "timeout, algorithm and logging options are accepted",
                hint=SSH_OPTIONS_HINT,
            )
        out += ["-o", f"{m.group(1)}={m.group(2)}"]
        i += 2
    return out


def parse_ssh_options(text: str, source: str = SSH_OPTIONS_ENV) -> list[str]:
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise DeployError(
            f"{source} cannot be parsed: {e}",
            hint='write it like a shell line: -o Key=Value -o "Key=value with spaces"',
        ) from None
    return check_ssh_options(tokens, source)


_DAMAGE = {
    "bundles notdir": f"'{BUNDLES}' is not a directory",
    "history.jsonl notfile": f"'{HISTORY}' is not a file",
    ".lock notfile": f"'{LOCK}' is not a file",
    ".intent record": f"'{INTENT}' is not an intent record",
}


class SshStore(Store):
    """A device store at ``ssh://[user@]host[:port]/path``; behaves as ``DeviceStore`` does.

    ``options`` are extra ``-o Key=Value`` ssh options (``open_store`` reads $EDGEKIT_SSH_OPTIONS).
    ``trust``: a trust store on this host (explicit, else ``$EDGEKIT_TRUST_DIR``) that must vouch for a
    bundle before it is sent; the version admitted is recorded in it. The device's agent checks again
    with the device's own trust store when it opens the bundle.
    """

    def __init__(
        self,
        url: str,
        *,
        options: Sequence[str] = (),
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
        ssh: str = "ssh",
        trust: Any = None,
    ) -> None:
        from edge.bundle.trust import resolve_trust

        self.trust = resolve_trust(trust) if trust is not False else None
        self.address = parse_ssh_url(url)
        self.options = check_ssh_options(options, "ssh options")
        self.where = url
        self.lock_timeout = lock_timeout
        self.ssh = shutil.which(ssh)
        if self.ssh is None:
            raise DeployError(
                f"shipping to {url} needs '{ssh}' on PATH", hint="install it (apt-get install openssh-client)"
            )
        self._mux: str | None = None  # a private directory for the shared connection's socket
        self._closer: weakref.finalize[Any, Any] | None = None

    # transport ---------------------------------------------------------------------------------
    def _base(self) -> list[str]:
        a = self.address
        if self._mux is None:  # one ssh connection shared by this store's operations, closed by close()
            self._mux = tempfile.mkdtemp(prefix="edgekit-ssh-")
            self._closer = weakref.finalize(
                self, _close_master, [str(self.ssh), *self._base_options()], self._mux, a.host
            )
        return [
            str(self.ssh),
            *self._base_options(),
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self._mux}/s",
            "-o",
            "ControlPersist=30",
        ]

    def _base_options(self) -> list[str]:
        a = self.address
        return [
            "-o",
            "BatchMode=yes",
            *self.options,
            "-o",
            "ConnectTimeout=20",
            *(["-p", str(a.port)] if a.port else []),
            *(["-l", a.user] if a.user else []),
        ]

    def argv(self, op: str, *args: str) -> list[str]:
        """The ssh command line for one operation: the script is constant, every value an argument."""
        remote = shlex.join(["sh", "-c", REMOTE_SCRIPT, "edgekit", op, self.address.path, *args])
        return [*self._base(), "--", self.address.host, remote]

    def close(self) -> None:
        """End the shared ssh connection (if one was opened)."""
        if self._closer is not None:
            self._closer()
        self._mux = self._closer = None

    def _call(
        self, op: str, *args: str, upload: tuple[Path, list[tuple[str, Path, bool]]] | None = None
    ) -> tuple[int, str, str]:
        """Run one operation; its stdout and stderr, each read with a bound (a device that answers gigabytes is
        stopped at :data:`MAX_ANSWER_BYTES` and refused in one line, never read into memory or onto disk)."""
        argv = self.argv(op, *args)
        stdin = subprocess.PIPE if upload is not None else subprocess.DEVNULL
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        got: dict[str, bytes] = {}
        over: list[str] = []

        def drain(name: str, pipe: IO[bytes], limit: int) -> None:
            chunks, n = [], 0
            while chunk := pipe.read(1 << 16):
                n += len(chunk)
                if n > limit:
                    over.append(name)
                    proc.kill()
                    break
                chunks.append(chunk)
            got[name] = b"".join(chunks)

        readers = [
            threading.Thread(target=drain, args=("out", proc.stdout, MAX_ANSWER_BYTES), daemon=True),
            threading.Thread(target=drain, args=("err", proc.stderr, MAX_ANSWER_BYTES), daemon=True),
        ]
        for t in readers:
            t.start()
        try:
            if upload is not None:
                assert proc.stdin is not None
                try:
                    _send_tar(proc.stdin, *upload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the device stopped reading: its exit status says why
                finally:
                    try:
                        proc.stdin.close()
                    except BrokenPipeError:
                        pass
            rc = proc.wait()
            for t in readers:
                t.join()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
        if over:
            raise DeployError(
                f"device store {self.where}: the device answered more than {MAX_ANSWER_BYTES >> 20} MiB to "
                f"'{op}' and was cut off",
                hint="is the address an edgekit device store? (its shell printed something else)",
            )
        return rc, got.get("out", b"").decode(errors="replace"), got.get("err", b"").decode(errors="replace")

    def _run(self, op: str, *args: str, ok: tuple[int, ...] = (0,), **kw: Any) -> tuple[int, str]:
        rc, out, err = self._call(op, *args, **kw)
        if rc not in ok:
            raise self._failure(rc, err)
        return rc, out

    def _failure(self, rc: int, stderr: str) -> DeployError:
        ours = [ln.split(": ", 1)[1] for ln in stderr.splitlines() if ln.startswith("edgekit-store: ")]
        msg = ours[-1] if ours else ""
        w = self.where
        if rc == 65 and msg.startswith("damaged "):
            what = msg[len("damaged ") :]
            name, _, kind = what.partition(" ")
            if name in (CURRENT, PREVIOUS):
                kind, _, target = kind.partition(" ")
                return damaged(w, link_kind_message(name, kind, target))
            return damaged(w, _DAMAGE.get(what, what))
        if rc == 67:
            return DeployError(
                f"device store {w} does not exist", hint="check --device; `edgekit deploy` creates a store"
            )
        if rc == 69:
            return DeployError(f"device store {w} has no previous bundle to roll back to")
        if rc == 70:
            return DeployError(f"device store {w} changed while rolling back", hint="run it again")
        if rc == 75:
            holder = msg.partition(" ")[2] or "?"
            return DeployError(
                f"device store {w} is busy: another deploy or rollback (pid {holder}) has held its lock for over {self.lock_timeout:g} s",
                hint="wait for it to finish, then run this again",
            )
        if ours:
            return DeployError(f"device store {w}: {msg}")
        tail = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        detail = tail[-1][:300] if tail else f"exit status {rc}"
        if rc == 255:
            return DeployError(
                f"cannot reach {self.address.login} over ssh: {detail}",
                hint=f"check the address, the key ({SSH_OPTIONS_ENV}='-o IdentityFile=...') and sshd",
            )
        if rc == 127:
            return DeployError(
                f"device store {w}: the device lacks a command the store needs: {detail}",
                hint="it needs sh, tar, sha256sum, mv -T, mktemp, readlink, sync (coreutils or busybox)",
            )
        return DeployError(f"device store {w}: ssh failed ({rc}): {detail}")

    # the Store interface -----------------------------------------------------------------------
    def _facts(self, out: str | None = None) -> tuple[bool, StoreState]:
        if out is None:
            _, out = self._run("state")
        lines = out.splitlines()
        if lines == ["absent"]:
            return False, StoreState(None, None)
        if len(lines) != 3 or not lines[0].startswith("intent "):
            raise DeployError(f"device store {self.where}: unexpected answer from the device: {out[:200]!r}")
        raw = lines[0][len("intent ") :]
        if raw == "?":
            raise damaged(self.where, f"'{INTENT}' is not an intent record")
        intent = None if raw == "-" else Intent.parse(self.where, raw)
        links: list[str | None] = []
        for name, line in zip((CURRENT, PREVIOUS), lines[1:]):
            n, _, rest = line.partition(" ")
            kind, _, target = rest.partition(" ")
            if n != name or kind not in ("link", "dir", "file", "none"):
                raise DeployError(f"device store {self.where}: unexpected answer from the device: {out[:200]!r}")
            if kind in ("dir", "file"):
                raise damaged(self.where, link_kind_message(name, kind))
            links.append(link_target_id(self.where, name, target) if kind == "link" else None)
        return True, state_of(intent, links[0], links[1])

    def state(self) -> StoreState:
        return self._facts()[1]

    def history(self) -> list[dict[str, Any]]:
        _, out = self._run("history")
        facts, sep, text = out.partition("\n--\n")
        if not sep:
            raise DeployError(f"device store {self.where}: unexpected answer from the device: {out[:200]!r}")
        return with_pending(parse_history(text), self._facts(facts + "\n")[1])

    def _timeout(self) -> str:
        return str(max(1, math.ceil(self.lock_timeout)))

    def install(self, bundle: Any) -> str:
        bid = check_bundle_id(bundle.id)
        admitted = None
        if self.trust is not None:  # before connecting: what is sent is what was checked (the tar carries manifest.sig)
            from edge.bundle.bundle import Bundle

            admitted = self.trust.check(Bundle.open(bundle.path, trust=False))
        sums = checksum_args(bundle)
        files = list(bundle_files(bundle.path))  # refuses links and devices before connecting
        rc, _ = self._run("install", self._timeout(), bid, "0", *sums, ok=(0, 3))
        if rc == 3:  # not on the device yet: send it
            self._run("install", self._timeout(), bid, "1", *sums, upload=(Path(bundle.path), files))
        if admitted is not None and self.trust is not None:
            self.trust.record(admitted, bid)
        return f"{self.address.login}:{self.address.path}/{BUNDLES}/{bid}"

    def rollback(self) -> str:
        from edge.bundle.bundle import MANIFEST, Bundle

        exists, st = self._facts()
        if not exists:
            raise self._failure(67, "")
        if st.previous is None:
            raise self._failure(69, "")
        prev = check_bundle_id(st.previous)
        _, text = self._run("manifest", prev)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / MANIFEST).write_text(text, encoding="utf-8")
            sums = checksum_args(Bundle.open(tmp, verify=False, trust=False))
        self._run("rollback", self._timeout(), prev, *sums)
        return prev


def _send_tar(stream: IO[bytes], base: Path, files: list[tuple[str, Path, bool]]) -> None:
    """The bundle as a plain ustar stream: regular files and directories, owned by nobody in particular."""
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for rel, path, is_dir in files:
            info = tarfile.TarInfo(rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if is_dir:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                st = path.stat()
                info.size, info.mode, info.mtime = st.st_size, 0o644, int(st.st_mtime)
                with open(path, "rb") as f:
                    try:
                        tar.addfile(info, f)
                    except ValueError as e:  # a name ustar cannot hold
                        raise DeployError(f"cannot send {base}: {rel}: {e}") from None


def _close_master(base: list[str], mux: str, host: str) -> None:
    if (Path(mux) / "s").exists():
        subprocess.run(
            [*base, "-o", f"ControlPath={mux}/s", "-O", "exit", "--", host],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=15,
            check=False,
        )
    shutil.rmtree(mux, ignore_errors=True)
