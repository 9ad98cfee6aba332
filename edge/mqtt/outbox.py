"""The device's durable outbox: every telemetry and state message is written here first.

paho-mqtt keeps unacknowledged messages in memory only; a device that must lose nothing
keeps its own. A message leaves the outbox when the broker acknowledges it (QoS 1 PUBACK),
so a broker outage, a lost connection, or the agent killed with SIGKILL all end the same
way: on the next connection the outbox is replayed in order, oldest first.

The outbox is bounded (messages and bytes). Past the bound the oldest messages are dropped,
the drop is counted (persistently), and telemetry reports it.

``SqliteOutbox`` lives in the device store (``<store>/agent/outbox.sqlite``): WAL journal,
``synchronous=NORMAL``, i.e. a committed message survives the process being killed; on power
loss the last commit or two may be lost (a full fsync per message would wear SD cards for
little gain at one message every few seconds). ``MemoryOutbox`` has the same interface for
the fleet simulator, where a thousand SQLite files would measure the disk, not the collector.

``SpillOutbox`` is what the agent uses: the SQLite outbox, and a bounded memory one beside it for the
messages the disk refuses (a full filesystem: SQLITE_FULL, ENOSPC). Ids stay one ascending sequence
across both, so the stream is still replayed in order; the disk is tried again every ``retry_s``. Messages
held in memory are lost if the agent stops before the disk takes writes again; telemetry says how many
(``spool.in_memory``) and why (``spool.disk_error``). Before it, a full store stopped every message and the
agent logged an internal error every second.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DEFAULT_MAX_MESSAGES = 50_000  # ~70 h of telemetry at the default 5 s interval
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MEMORY_MAX_BYTES = 16 * 1024 * 1024  # the most a SpillOutbox holds in memory while the disk refuses writes

log = logging.getLogger("edge.mqtt")


@dataclass(frozen=True)
class OutboxRow:
    id: int
    topic: str
    payload: bytes
    conn_key: str | None  # the connection it was made on, None when made offline
    created: float


class Outbox(Protocol):
    max_messages: int
    max_bytes: int

    def next_session(self) -> int: ...
    def append(self, topic: str, payload: bytes, conn_key: str | None) -> int: ...
    def peek(self, after_id: int, limit: int) -> list[OutboxRow]: ...
    def ack(self, row_id: int) -> None: ...
    def pending(self) -> int: ...
    def pending_bytes(self) -> int: ...
    @property
    def dropped_total(self) -> int: ...
    def close(self) -> None: ...


class SqliteOutbox:
    def __init__(
        self, path: str | Path, *, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("outbox bounds must be positive")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript("""
            CREATE TABLE IF NOT EXISTS outbox (
                id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload BLOB NOT NULL,
                conn_key TEXT, created REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        """)
        self._count: int
        self._bytes: int
        self._count, self._bytes = self._db.execute(
            "SELECT count(*), coalesce(sum(length(payload)), 0) FROM outbox"
        ).fetchone()
        self._dropped = self._meta("dropped")

    def _meta(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def _set_meta(self, key: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def next_session(self) -> int:
        """Count one more agent run, durably, before it publishes anything.

        Seeded by the clock (``max(last + 1, unix seconds)``) so that a device whose store was
        wiped does not reuse old (session, seq) keys, which a collector would drop as duplicates.
        """
        with self._tx():
            n = max(self._meta("session") + 1, int(time.time()))
            self._set_meta("session", n)
        return n

    def _tx(self) -> _Tx:
        return _Tx(self._db)

    def append(self, topic: str, payload: bytes, conn_key: str | None, row_id: int | None = None) -> int:
        """Write one message (``row_id``: its id, above every id written before; default: the next one)."""
        size = len(payload)
        before = self._count, self._bytes, self._dropped
        try:
            with self._tx():
                cur = self._db.execute(
                    "INSERT INTO outbox(id, topic, payload, conn_key, created) VALUES (?, ?, ?, ?, ?)",
                    (row_id, topic, payload, conn_key, time.time()),
                )
                self._count += 1
                self._bytes += size
                dropped = 0
                while self._count > self.max_messages or (self._bytes > self.max_bytes and self._count > 1):
                    row = self._db.execute("SELECT id, length(payload) FROM outbox ORDER BY id LIMIT 1").fetchone()
                    self._db.execute("DELETE FROM outbox WHERE id = ?", (row[0],))
                    self._count -= 1
                    self._bytes -= row[1]
                    dropped += 1
                if dropped:
                    self._dropped += dropped
                    self._set_meta("dropped", self._dropped)
        except BaseException:  # rolled back (or the commit failed): the counts are what the file holds
            self._count, self._bytes, self._dropped = before
            raise
        return int(cur.lastrowid or 0)

    def last_id(self) -> int:
        """The highest id ever given (AUTOINCREMENT never reuses one, even after its row is acknowledged)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'").fetchone()
        return int(row[0]) if row else 0

    def peek(self, after_id: int, limit: int) -> list[OutboxRow]:
        rows = self._db.execute(
            "SELECT id, topic, payload, conn_key, created FROM outbox WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        ).fetchall()
        return [OutboxRow(r[0], r[1], bytes(r[2]), r[3], r[4]) for r in rows]

    def ack(self, row_id: int) -> None:
        row = self._db.execute("SELECT length(payload) FROM outbox WHERE id = ?", (row_id,)).fetchone()
        if row is not None:  # no RETURNING: devices run SQLite older than 3.35
            self._db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))
            self._count -= 1
            self._bytes -= row[0]

    def pending(self) -> int:
        return self._count

    def pending_bytes(self) -> int:
        return self._bytes

    @property
    def dropped_total(self) -> int:
        return self._dropped

    def close(self) -> None:
        self._db.close()


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")


class MemoryOutbox:
    """Same bounds and semantics, in memory (simulated devices, tests)."""

    def __init__(
        self, *, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES, session: int = 0
    ) -> None:
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self._rows: OrderedDict[int, OutboxRow] = OrderedDict()
        self._next_id = 1
        self._bytes = 0
        self._dropped = 0
        self._session = session

    def next_session(self) -> int:
        self._session = max(self._session + 1, int(time.time()))
        return self._session

    def append(self, topic: str, payload: bytes, conn_key: str | None, row_id: int | None = None) -> int:
        rid = self._next_id if row_id is None else row_id
        self._next_id = rid + 1
        self._rows[rid] = OutboxRow(rid, topic, payload, conn_key, time.time())
        self._bytes += len(payload)
        while len(self._rows) > self.max_messages or (self._bytes > self.max_bytes and len(self._rows) > 1):
            _, old = self._rows.popitem(last=False)
            self._bytes -= len(old.payload)
            self._dropped += 1
        return rid

    def peek(self, after_id: int, limit: int) -> list[OutboxRow]:
        out = []
        for rid, row in self._rows.items():  # ids ascend; a device keeps few rows while connected
            if rid > after_id:
                out.append(row)
                if len(out) >= limit:
                    break
        return out

    def holds(self, row_id: int) -> bool:
        return row_id in self._rows

    def ack(self, row_id: int) -> None:
        row = self._rows.pop(row_id, None)
        if row is not None:
            self._bytes -= len(row.payload)

    def pending(self) -> int:
        return len(self._rows)

    def pending_bytes(self) -> int:
        return self._bytes

    @property
    def dropped_total(self) -> int:
        return self._dropped

    def close(self) -> None:
        self._rows.clear()


class SpillOutbox:
    """The SQLite outbox, and memory beside it while the disk refuses writes (see the module's docstring)."""

    def __init__(self, disk: SqliteOutbox, *, retry_s: float = 30.0, memory_max_bytes: int = MEMORY_MAX_BYTES) -> None:
        self.disk = disk
        self.max_messages, self.max_bytes = disk.max_messages, disk.max_bytes
        self.memory = MemoryOutbox(max_messages=disk.max_messages, max_bytes=min(disk.max_bytes, memory_max_bytes))
        self.retry_s = retry_s
        self.disk_error: str | None = None  # why the last write to the disk failed; None while it takes them
        self.spilled_total = 0  # messages kept in memory because the disk refused them
        self._retry_at = 0.0
        self._next = disk.last_id() + 1
        self._ack_later: set[int] = set()  # acknowledged rows the disk would not delete yet (skipped by peek)
        self._session = 0
        self.volatile = False  # the "disk" is an in-memory SQLite (the file could not be opened): disk_error stays

    @classmethod
    def open(cls, path: str | Path, *, max_messages: int, max_bytes: int) -> SpillOutbox:
        """The outbox at ``path``; when it cannot even be opened (a full disk at the first start, a damaged
        file), an in-memory SQLite one for this run, said once and in every telemetry's ``spool.disk_error``."""
        try:
            return cls(SqliteOutbox(path, max_messages=max_messages, max_bytes=max_bytes))
        except (sqlite3.Error, OSError) as e:
            log.error("outbox %s cannot be opened (%s): messages are kept in memory for this run", path, e)
            spill = cls(SqliteOutbox(":memory:", max_messages=max_messages, max_bytes=max_bytes))
            spill.disk_error = f"cannot open {path}: {type(e).__name__}: {str(e)[:200]}"
            spill.volatile = True
            return spill

    def _failed(self, what: str, e: BaseException) -> None:
        if self.disk_error is None:
            log.warning(
                "outbox %s: %s failed (%s): messages are kept in memory (at most %d MiB) until the disk takes "
                "writes again; they are lost if the agent stops before",
                self.disk.path,
                what,
                e,
                self.memory.max_bytes >> 20,
            )
        self.disk_error = f"{type(e).__name__}: {str(e)[:200]}"
        self._retry_at = time.monotonic() + self.retry_s

    def _disk_ok(self) -> bool:
        return self.disk_error is None or time.monotonic() >= self._retry_at

    def next_session(self) -> int:
        try:
            self._session = self.disk.next_session()
        except (sqlite3.Error, OSError) as e:  # a full disk at start: a session from the clock, as the disk's is
            self._failed("counting the session", e)
            self._session = max(self._session + 1, int(time.time()))
        return self._session

    def append(self, topic: str, payload: bytes, conn_key: str | None) -> int:
        rid = self._next
        self._next = rid + 1
        if self._disk_ok():
            try:
                self.disk.append(topic, payload, conn_key, row_id=rid)
            except (sqlite3.Error, OSError) as e:
                self._failed("a write", e)
            else:
                if self.volatile:
                    return rid
                if self.disk_error is not None:
                    log.info(
                        "outbox %s takes writes again (%d message(s) in memory)", self.disk.path, self.memory.pending()
                    )
                self.disk_error = None
                self._retry_acks()
                return rid
        self.memory.append(topic, payload, conn_key, row_id=rid)
        self.spilled_total += 1
        return rid

    def _retry_acks(self) -> None:
        for rid in sorted(self._ack_later):
            try:
                self.disk.ack(rid)
            except (sqlite3.Error, OSError):
                return
            self._ack_later.discard(rid)

    def peek(self, after_id: int, limit: int) -> list[OutboxRow]:
        rows = [r for r in self.disk.peek(after_id, limit + len(self._ack_later)) if r.id not in self._ack_later]
        rows += self.memory.peek(after_id, limit)
        rows.sort(key=lambda r: r.id)
        return rows[:limit]

    def ack(self, row_id: int) -> None:
        if self.memory.holds(row_id):
            self.memory.ack(row_id)
            return
        try:
            self.disk.ack(row_id)
        except (sqlite3.Error, OSError) as e:  # deleted later; never sent again meanwhile
            self._failed("an acknowledgement", e)
            self._ack_later.add(row_id)

    def pending(self) -> int:
        return self.disk.pending() - len(self._ack_later) + self.memory.pending()

    def pending_bytes(self) -> int:
        return self.disk.pending_bytes() + self.memory.pending_bytes()

    @property
    def dropped_total(self) -> int:
        return self.disk.dropped_total + self.memory.dropped_total

    def close(self) -> None:
        if self.memory.pending():
            log.warning(
                "outbox %s: %d message(s) held in memory (the disk refused them) are lost",
                self.disk.path,
                self.memory.pending(),
            )
        self.disk.close()
        self.memory.close()
