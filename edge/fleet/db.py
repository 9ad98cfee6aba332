"""The collector's store: SQLite by default, PostgreSQL for ``postgresql://`` URLs, one schema.

SQL is written once with ``?`` placeholders and portable syntax (``ON CONFLICT ... DO
NOTHING/UPDATE ... WHERE``, ``DOUBLE PRECISION``, ``BIGINT``, ``BOOLEAN``), which both
SQLite (3.24+) and PostgreSQL (9.5+) accept. Timestamps are Unix epoch seconds.

PostgreSQL (11+): a new database gets ``telemetry`` as a table partitioned by range of ``received_at``,
one partition per UTC day (``telemetry_pYYYYMMDD``), created ahead (``PARTITIONS_AHEAD`` days) and on demand
by the writer, so retention drops whole partitions (``edge.fleet.retention``). PostgreSQL cannot have a
unique key across partitions that leaves out the partition key, so de-duplication by (fleet, device,
session, seq) is done by the writer under a per-device lock (``lock_devices``): a row whose seq is past its
stream's committed ``max_seq`` is new, any other is inserted only if no stored row has its key
(``insert_telemetry``). A database made before partitioning (telemetry a plain table with its primary key)
keeps working as it is: ``partitioned`` is false, rows are de-duplicated by the primary key and retention
deletes rows; nothing is converted behind the user's back.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote, urlparse

from edge.errors import EdgeError, MissingDependencyError
from edge.fleet import pgarray

SCHEMA_VERSION = 1

_DEVICE_COLUMNS = """
    fleet TEXT NOT NULL, device TEXT NOT NULL,
    online BOOLEAN, session BIGINT, connection BIGINT, birth_at DOUBLE PRECISION, death_at DOUBLE PRECISION,
    death_reason TEXT, last_seen DOUBLE PRECISION, interval_s DOUBLE PRECISION,
    bundle_id TEXT, target TEXT, runtime TEXT, device_used TEXT, precision_used TEXT, edgekit_version TEXT,
    hostname TEXT, state TEXT, state_detail TEXT,
    last_session BIGINT, last_seq BIGINT, last_ts DOUBLE PRECISION,
    fps DOUBLE PRECISION, p50_ms DOUBLE PRECISION, p99_ms DOUBLE PRECISION, max_ms DOUBLE PRECISION,
    budget_ms DOUBLE PRECISION, misses BIGINT, frames BIGINT, cpu_percent DOUBLE PRECISION, rss_mb DOUBLE PRECISION,
    temp_c DOUBLE PRECISION, throttled BOOLEAN, spool_pending BIGINT, spool_dropped BIGINT,
    PRIMARY KEY (fleet, device)"""

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS devices ({_DEVICE_COLUMNS})",
    """CREATE TABLE IF NOT EXISTS births (
        fleet TEXT NOT NULL, device TEXT NOT NULL, session BIGINT NOT NULL, connection BIGINT NOT NULL,
        seq BIGINT NOT NULL, ts DOUBLE PRECISION NOT NULL, received_at DOUBLE PRECISION NOT NULL, payload TEXT NOT NULL,
        PRIMARY KEY (fleet, device, session, connection, seq))""",
    """CREATE TABLE IF NOT EXISTS deaths (
        fleet TEXT NOT NULL, device TEXT NOT NULL, session BIGINT NOT NULL, connection BIGINT NOT NULL,
        seq BIGINT NOT NULL, ts DOUBLE PRECISION NOT NULL, received_at DOUBLE PRECISION NOT NULL, reason TEXT,
        payload TEXT NOT NULL, PRIMARY KEY (fleet, device, session, connection))""",
    """CREATE TABLE IF NOT EXISTS telemetry (
        fleet TEXT NOT NULL, device TEXT NOT NULL, session BIGINT NOT NULL, seq BIGINT NOT NULL,
        ts DOUBLE PRECISION NOT NULL, received_at DOUBLE PRECISION NOT NULL, historical BOOLEAN NOT NULL,
        fps DOUBLE PRECISION, p50_ms DOUBLE PRECISION, p99_ms DOUBLE PRECISION, max_ms DOUBLE PRECISION,
        misses BIGINT, frames BIGINT, cpu_percent DOUBLE PRECISION, rss_mb DOUBLE PRECISION, temp_c DOUBLE PRECISION,
        payload TEXT NOT NULL, PRIMARY KEY (fleet, device, session, seq))""",
    """CREATE TABLE IF NOT EXISTS states (
        fleet TEXT NOT NULL, device TEXT NOT NULL, session BIGINT NOT NULL, seq BIGINT NOT NULL,
        ts DOUBLE PRECISION NOT NULL, received_at DOUBLE PRECISION NOT NULL, historical BOOLEAN NOT NULL,
        state TEXT, detail TEXT, payload TEXT NOT NULL, PRIMARY KEY (fleet, device, session, seq))""",
    # one row per (device, session): how many stream messages arrived, the highest seq seen or announced
    """CREATE TABLE IF NOT EXISTS streams (
        fleet TEXT NOT NULL, device TEXT NOT NULL, session BIGINT NOT NULL, received BIGINT NOT NULL,
        max_seq BIGINT NOT NULL, announced_seq BIGINT NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (fleet, device, session))""",
    # per device, the latest stream refused for a sequence jump (a forged or broken sender): shown by fleet status.
    # Added after schema 1 was released: created where missing, so older databases gain it on open.
    """CREATE TABLE IF NOT EXISTS stream_flags (
        fleet TEXT NOT NULL, device TEXT NOT NULL, session BIGINT NOT NULL, reason TEXT NOT NULL,
        refused BIGINT NOT NULL, max_seq BIGINT NOT NULL, stream_seq BIGINT NOT NULL,
        first_at DOUBLE PRECISION NOT NULL, last_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (fleet, device))""",
    # per device, the identity key its births and deaths are signed with, pinned at its first signed birth (trust on
    # first use) or by the operator (edge.fleet.device_keys), and the last birth or death refused against it (shown
    # by fleet status). Added after schema 1 was released: created where missing, so older databases gain it on open.
    """CREATE TABLE IF NOT EXISTS device_keys (
        fleet TEXT NOT NULL, device TEXT NOT NULL, key TEXT NOT NULL, pinned_at DOUBLE PRECISION NOT NULL,
        pinned_by TEXT NOT NULL, refused BIGINT NOT NULL, refused_reason TEXT, refused_key TEXT,
        refused_at DOUBLE PRECISION, PRIMARY KEY (fleet, device))""",
    "CREATE INDEX IF NOT EXISTS telemetry_received ON telemetry (received_at)",
    "CREATE INDEX IF NOT EXISTS states_received ON states (received_at)",  # retention
]
_TELEMETRY_TABLE = next(x for x in SCHEMA if x.startswith("CREATE TABLE IF NOT EXISTS telemetry "))
_TELEMETRY_COLUMNS = _TELEMETRY_TABLE[_TELEMETRY_TABLE.index("(") + 1 : _TELEMETRY_TABLE.index(", PRIMARY KEY")]
# PostgreSQL, new databases: partitioned by day of arrival; the key index is not unique (see the module doc)
PG_PARTITIONED_TELEMETRY = [
    f"CREATE TABLE telemetry ({_TELEMETRY_COLUMNS}) PARTITION BY RANGE (received_at)",
    "CREATE INDEX telemetry_key ON telemetry (fleet, device, session, seq)",
    # BRIN: rows arrive in received_at order, so block ranges summarise it for retention's delete in the cut's
    # partition at a fraction of a B-tree's cost per insert (COPY of 100,000 rows: 8 vs 10 us a row of server CPU)
    "CREATE INDEX telemetry_received ON telemetry USING brin (received_at)",
]
PARTITION_S = 86400  # one partition per UTC day
PARTITIONS_AHEAD = 3  # days created ahead of the writer's clock (and one behind)
TELEMETRY_COLUMNS = (
    "fleet",
    "device",
    "session",
    "seq",
    "ts",
    "received_at",
    "historical",
    "fps",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "misses",
    "frames",
    "cpu_percent",
    "rss_mb",
    "temp_c",
    "payload",
)
TELEMETRY_TYPES = (
    "text",
    "text",
    "bigint",
    "bigint",
    "float8",
    "float8",
    "boolean",
    "float8",
    "float8",
    "float8",
    "float8",
    "bigint",
    "bigint",
    "float8",
    "float8",
    "float8",
    "text",
)
# partitioned telemetry, one statement per batch (see ``FleetDB.insert_telemetry``)
_PARTITIONED_INSERT = (
    f"INSERT INTO telemetry ({', '.join(TELEMETRY_COLUMNS)}) SELECT u.* FROM unnest("
    + ", ".join(f"%b::{t}[]" for t in TELEMETRY_TYPES)
    + f") AS u({', '.join(TELEMETRY_COLUMNS)}) "
    "WHERE u.seq > coalesce((SELECT s.max_seq FROM streams s WHERE s.fleet = u.fleet AND s.device = u.device "
    "AND s.session = u.session), -1) OR NOT EXISTS (SELECT 1 FROM telemetry t WHERE t.fleet = u.fleet "
    "AND t.device = u.device AND t.session = u.session AND t.seq = u.seq) RETURNING fleet, device, session, seq"
)
_STREAM_MAX_SEQ = (
    "SELECT s.fleet, s.device, s.session, s.max_seq FROM unnest(%b::text[], %b::text[], %b::bigint[]) "
    "AS k(fleet, device, session) JOIN streams s ON s.fleet = k.fleet AND s.device = k.device "
    "AND s.session = k.session"
)
_COPY_TELEMETRY = f"COPY telemetry ({', '.join(TELEMETRY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_PARTITION_LOCK = 0x6564676B69740001  # the advisory lock that serialises partition DDL between writers


def partition_name(day: int) -> str:
    """``telemetry_pYYYYMMDD`` for the UTC day starting at ``day * PARTITION_S``."""
    return "telemetry_p" + time.strftime("%Y%m%d", time.gmtime(day * PARTITION_S))


def device_lock_key(fleet: str, device: str) -> int:
    """A signed 64-bit advisory lock key for one device (collisions only serialise two devices' writers)."""
    h = hashlib.blake2b(f"{fleet}/{device}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big", signed=True)


class FleetDB:
    """A DB-API connection with ``?`` placeholders on both dialects. Not thread-safe: one per thread."""

    def __init__(self, conn: Any, dialect: str, url: str) -> None:
        self.conn, self.dialect = conn, dialect
        self.url = redact(url)  # for messages: the password of a postgresql:// URL is never kept here
        self._cur = conn.cursor()
        self.partitioned = False  # PostgreSQL telemetry partitioned by day (set by init_schema)
        self._days: set[int] = set()  # partitions known to exist

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self.dialect == "postgresql":
            sql = sql.replace("?", "%s")
        self._cur.execute(sql, params)
        return self._cur

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """One prepared statement for every row (PostgreSQL: pipelined, one round trip); rows changed."""
        if self.dialect == "postgresql":
            sql = sql.replace("?", "%s")
        self._cur.executemany(sql, rows)
        return int(self._cur.rowcount)

    def bulk(self, sql: str, rows: Sequence[Sequence[Any]], types: Sequence[str]) -> int:
        """``executemany`` of an ``INSERT ... VALUES (?, ...)`` or an ``UPDATE ... SET ... WHERE ...`` written with
        ``?``; rows changed. PostgreSQL: one statement for all the rows, their columns sent as arrays of ``types``
        (``unnest``): one execution on the server instead of one per row (``_unnest``). The rows must not
        touch one row twice (an ``ON CONFLICT DO UPDATE`` or an ``UPDATE ... FROM`` would refuse or skip it)."""
        if self.dialect != "postgresql":
            return self.executemany(sql, rows)
        if not rows:
            return 0
        self._cur.execute(_unnest(sql, types), pgarray.columns(rows, types))
        return int(self._cur.rowcount)

    def insert_new(
        self, sql: str, rows: Sequence[Sequence[Any]], types: Sequence[str] | None = None, key: int = 4
    ) -> list[bool]:
        """An ``INSERT ... ON CONFLICT DO NOTHING`` of every row (their first ``key`` values unique among them);
        which rows it inserted.

        PostgreSQL with ``types``: one statement (``bulk``) that returns the keys it inserted. Otherwise all rows
        in one ``executemany`` when none of them is already stored (the common case); when some are
        (re-deliveries), that is undone to a savepoint and the rows go one by one to tell which."""
        if self.dialect == "postgresql" and types is not None:
            if not rows:
                return []
            names = sql[sql.index("(") + 1 : sql.index(")")].split(",")[:key]
            self._cur.execute(
                _unnest(sql, types) + " RETURNING " + ", ".join(n.strip() for n in names), pgarray.columns(rows, types)
            )
            got = set(self._cur.fetchall())
            return [tuple(r[:key]) in got for r in rows]
        if self.dialect == "sqlite" and not self.conn.in_transaction:
            self._cur.execute("BEGIN")  # else the savepoint would open the transaction and its RELEASE commit it
        self._cur.execute("SAVEPOINT edgekit_rows")
        if self.executemany(sql, rows) == len(rows):
            self._cur.execute("RELEASE SAVEPOINT edgekit_rows")
            return [True] * len(rows)
        self._cur.execute("ROLLBACK TO SAVEPOINT edgekit_rows")
        self._cur.execute("RELEASE SAVEPOINT edgekit_rows")
        return [self.execute(sql, row).rowcount == 1 for row in rows]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def close(self) -> None:
        try:
            self._cur.close()
        finally:
            self.conn.close()

    def __enter__(self) -> FleetDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def init_schema(self) -> None:
        if self.dialect == "postgresql":
            kind = self.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass('telemetry')").fetchone()
            if kind is None:
                self.execute("SELECT pg_advisory_xact_lock(?)", (_PARTITION_LOCK,))  # two writers starting at once
                kind = self.execute(
                    "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass('telemetry')"
                ).fetchone()
                if kind is None:
                    for stmt in PG_PARTITIONED_TELEMETRY:
                        self.execute(stmt)
                    kind = ("p",)
            self.partitioned = kind[0] == "p"
        for stmt in SCHEMA:
            if self.partitioned and stmt.startswith(
                ("CREATE TABLE IF NOT EXISTS telemetry ", "CREATE INDEX IF NOT EXISTS telemetry_")
            ):
                continue
            self.execute(stmt)
        if self.partitioned:
            day = int(time.time() // PARTITION_S)
            self.ensure_partitions(range(day - 1, day + PARTITIONS_AHEAD + 1))
        row = self.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            self.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif str(row[0]) != str(SCHEMA_VERSION):
            raise EdgeError(
                f"{self.url} holds fleet schema {str(row[0])[:20]!r}; this edgekit uses {SCHEMA_VERSION}",
                hint="use a new database, or the edgekit version that created it",
            )
        self.commit()

    # PostgreSQL, partitioned telemetry ---------------------------------------------------------
    def partitions(self) -> dict[int, str]:
        """The telemetry partitions: UTC day number -> table name (only ``telemetry_pYYYYMMDD`` ones)."""
        if not self.partitioned:
            return {}
        rows = self.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass('telemetry')"
        ).fetchall()
        out = {}
        for (name,) in rows:
            m = re.fullmatch(r"telemetry_p(\d{8})", name)
            if m:
                t = time.strptime(m.group(1), "%Y%m%d")
                out[int(_timegm(t) // PARTITION_S)] = name
        return out

    def ensure_partitions(self, days: Any) -> int:
        """Create the daily partitions among ``days`` (day numbers) that do not exist yet; how many were made.

        In the caller's transaction, before it takes any device lock (the DDL waits for other writers'
        transactions; they never wait for this one's device locks, so no deadlock)."""
        want = sorted(set(days) - self._days)
        if not want or not self.partitioned:
            return 0
        self.execute("SELECT pg_advisory_xact_lock(?)", (_PARTITION_LOCK,))
        have = self.partitions()
        made = 0
        for day in want:
            if day not in have:
                self.execute(
                    f"CREATE TABLE {partition_name(day)} PARTITION OF telemetry FOR VALUES FROM "
                    f"({day * PARTITION_S}) TO ({(day + 1) * PARTITION_S})"
                )
                made += 1
        self._days.update(want)
        self._days.update(have)
        return made

    def ensure_partitions_for(self, times: Any) -> int:
        """The partitions these arrival times (Unix seconds) fall in, and ``PARTITIONS_AHEAD`` days past this
        host's today: a writer that runs for weeks creates each day's partition days before its first row."""
        today = int(time.time() // PARTITION_S)
        return self.ensure_partitions(
            {int(t // PARTITION_S) for t in times} | set(range(today, today + PARTITIONS_AHEAD + 1))
        )

    def forget_partitions(self) -> None:
        """Drop what this connection knows about existing partitions (after a rollback or a DROP)."""
        self._days.clear()

    def lock_devices(self, keys: Any) -> None:
        """PostgreSQL: lock these (fleet, device) pairs until the transaction ends, in one global order, so
        writers of the same devices take turns and never deadlock. SQLite has one writer at a time anyway."""
        if self.dialect != "postgresql":
            return
        locks = sorted({device_lock_key(f, d) for f, d in keys})
        if locks:
            self.execute("SELECT count(pg_advisory_xact_lock(k)) FROM unnest(?::bigint[]) AS k", (locks,))

    def insert_telemetry(self, sql: str, rows: Sequence[Sequence[Any]]) -> list[bool]:
        """Insert telemetry rows (``TELEMETRY_COLUMNS``, keys unique among them); which were new. ``sql`` is the
        primary-key path's ``INSERT ... ON CONFLICT DO NOTHING`` for SQLite and unpartitioned PostgreSQL.
        Partitioned: the caller has made the rows' partitions (``ensure_partitions_for``, before any lock) and
        holds the rows' device locks (``lock_devices``); a row whose seq is past its stream's committed highest seq
        goes in by COPY, any other only when no stored row has its key (a lookup in every partition's index)."""
        if self.dialect == "postgresql" and not self.partitioned:
            return self.insert_new(sql, rows, TELEMETRY_TYPES)
        if not self.partitioned:
            return self.insert_new(sql, rows)
        if not rows:
            return []
        # The streams' committed highest seq (under the caller's device locks nobody else moves it): a row past it
        # is new for sure and goes in by binary COPY, psycopg's C path (the arrays of one statement are dumped in
        # Python: 3x the client CPU; the per-row subquery is server CPU). The rest, re-deliveries and late gap
        # fillers, takes the statement that looks its key up.
        streams = {(r[0], r[1], r[2]) for r in rows}
        self._cur.execute(_STREAM_MAX_SEQ, pgarray.columns(list(streams), ("text", "text", "bigint")))
        top = {(f, d, s): m for f, d, s, m in self._cur.fetchall()}
        fresh = [r[3] > top.get((r[0], r[1], r[2]), -1) for r in rows]
        with self._cur.copy(_COPY_TELEMETRY) as cp:
            cp.set_types(TELEMETRY_TYPES)
            for r, new in zip(rows, fresh):
                if new:
                    cp.write_row(r)
        maybe = [r for r, new in zip(rows, fresh) if not new]
        if not maybe:
            return fresh
        self._cur.execute(_PARTITIONED_INSERT, pgarray.columns(maybe, TELEMETRY_TYPES))
        got = set(self._cur.fetchall())
        return [new or tuple(r[:4]) in got for r, new in zip(rows, fresh)]


_UNNEST_CACHE: dict[tuple[str, tuple[str, ...]], str] = {}


def _unnest(sql: str, types: Sequence[str]) -> str:
    """A ``?`` statement for ``executemany`` as one PostgreSQL statement over column arrays (``%b::type[]``,
    sent in binary: psycopg's text form of a list escapes every element with a regular expression, 3x slower):
    ``INSERT INTO t (cols) VALUES (?, 0, ?) ...`` -> ``INSERT INTO t (cols) SELECT u.c0, 0, u.c1 FROM
    unnest(%b::text[], %b::bigint[]) AS u(c0, c1) ...``; ``UPDATE t SET a = ? WHERE b = ?`` -> ``UPDATE t SET
    a = u.c0 FROM unnest(...) AS u(c0, c1) WHERE b = u.c1``. Our own statements only (no ``?`` in literals)."""
    cache_key = (sql, tuple(types))
    out = _UNNEST_CACHE.get(cache_key)
    if out is not None:
        return out
    if sql.count("?") != len(types):
        raise ValueError(f"{len(types)} types for {sql.count('?')} parameters in {sql[:60]!r}")
    names = iter(f"u.c{i}" for i in range(len(types)))
    src = (
        "unnest("
        + ", ".join(f"%b::{t}[]" for t in types)
        + ") AS u("
        + ", ".join(f"c{i}" for i in range(len(types)))
        + ")"
    )
    if sql.startswith("INSERT INTO "):
        head, rest = sql.split(" VALUES (", 1)
        values, tail = rest.split(")", 1)
        exprs = ", ".join(next(names) if v.strip() == "?" else v.strip() for v in values.split(","))
        out = f"{head} SELECT {exprs} FROM {src}{tail}"
    elif sql.startswith("UPDATE "):
        head, where = sql.split(" WHERE ", 1)
        head = re.sub(r"\?", lambda m: next(names), head)
        out = f"{head} FROM {src} WHERE " + re.sub(r"\?", lambda m: next(names), where)
    else:
        raise ValueError(f"cannot run {sql[:40]!r} over column arrays")
    _UNNEST_CACHE[cache_key] = out
    return out


def _timegm(t: time.struct_time) -> float:
    import calendar

    return float(calendar.timegm(t))


SQLITE_SYNCHRONOUS = ("off", "normal", "full")
DEFAULT_SQLITE_SYNCHRONOUS = "full"


def _sqlite_path(url: str) -> str:
    return _sqlite_options(url)[0]


def _sqlite_options(url: str) -> tuple[str, str]:
    """The file of a ``sqlite://`` URL and its ``?synchronous=`` setting (WAL mode always):

    - ``full`` (default): the WAL is synced at every commit; a commit survives a power cut or an OS crash.
      The collector acknowledges a batch only after its commit, so this is what "nothing lost" needs, and
      batching makes it one fsync per batch, not per message.
    - ``normal``: synced at checkpoints only; survives the collector's crash, but a power cut can take back
      the last commits, whose messages the broker then no longer holds.
    - ``off``: never synced; an OS crash can corrupt the file. For throw-away measurements only.
    """
    rest, _, query = url[len("sqlite://") :].partition("?")
    sync = DEFAULT_SQLITE_SYNCHRONOUS
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key != "synchronous" or value.lower() not in SQLITE_SYNCHRONOUS:
            raise EdgeError(
                f"bad SQLite URL option {part[:60]!r} in {redact(url)!r}",
                hint="the one option is ?synchronous=full (default), normal or off",
            )
        sync = value.lower()
    if rest in ("", "/", "/:memory:"):
        return ":memory:", sync
    if not rest.startswith("/"):
        raise EdgeError(
            f"bad SQLite URL {redact(url)!r}", hint="use sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    return rest[1:], sync


def check_url(url: str) -> str:
    """The kind of database a URL names ("sqlite" or "postgresql"); a bad or unsupported URL raises. Touches nothing."""
    try:
        scheme = urlparse(url).scheme
    except ValueError as e:  # e.g. an unclosed "[" of an IPv6 host
        raise EdgeError(f"bad database URL {redact(url)!r}: {e}") from None
    if scheme == "sqlite":
        _sqlite_path(url)
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    raise EdgeError(f"unsupported database URL {redact(url)!r}", hint="use sqlite:///fleet.db or postgresql://...")


COLLECTOR_APPLICATION = "edgekit-collector"  # PostgreSQL application_name of a collector's connection


def open_db(url: str, *, must_exist: bool = False, application_name: str = "edgekit") -> FleetDB:
    """``sqlite:///fleet.db`` (relative), ``sqlite:////var/lib/edgekit/fleet.db`` (absolute) or ``postgresql://...``.

    PostgreSQL: the connection's ``application_name`` (unless the URL sets one) says who it is in
    ``pg_stat_activity`` (``fleet partition`` refuses to convert a database collectors are writing to)."""
    if check_url(url) == "sqlite":
        path, sync = _sqlite_options(url)
        if path != ":memory:":
            p = Path(path)
            if must_exist and not p.exists():
                raise EdgeError(f"fleet database {p} does not exist", hint="start `edgekit fleet collect` first")
            if p.exists() and not p.is_file():  # /dev/null, a directory, a FIFO: SQLite's errors say "disk I/O"
                raise EdgeError(f"fleet database {p} is not a regular file", hint="give --db sqlite:///PATH to a file")
            p.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=10.0, check_same_thread=False)

        def setup() -> None:
            # the first read of the file: a non-database fails here; WAL set only when not yet (another writer's
            # file is WAL already, and asking again can be refused while it writes)
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={sync.upper()}")  # one of SQLITE_SYNCHRONOUS
            # pages kept between transactions: up to 64 MiB (the default is 2 MiB), so the telemetry key index's
            # pages stay in memory; measured 5-15% more messages a second in the collector's batches
            conn.execute("PRAGMA cache_size=-65536")

        try:
            _while_locked(setup, conn)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise EdgeError(
                f"{path} cannot be used as the fleet database: {e}",
                hint="is it a SQLite file, and complete? give another --db",
            ) from None
        db = FleetDB(conn, "sqlite", url)
        driver_errors: tuple[type[BaseException], ...] = (sqlite3.DatabaseError,)
    else:
        try:
            import psycopg
        except ImportError:
            raise MissingDependencyError(
                "PostgreSQL support needs psycopg 3", hint="pip install 'edgekit-ml[fleet]'"
            ) from None
        try:
            named: dict[str, Any] = {} if "application_name" in url else {"application_name": application_name}
            pg = psycopg.connect(url, connect_timeout=10, **named)
        except psycopg.Error as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise EdgeError(f"cannot connect to {redact(url)}: {scrub(first, url)}") from None
        pgarray.register(pg)
        db = FleetDB(pg, "postgresql", url)
        driver_errors = (psycopg.Error,)
    try:
        if db.dialect == "sqlite":  # beside a busy writer (another collector) the schema check can be refused
            _while_locked(db.init_schema, conn)
        else:
            db.init_schema()  # idempotent
    except driver_errors as e:  # a file SQLite cannot write, a database holding another program's tables
        db.close()
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise EdgeError(
            f"{redact(url)} cannot be used as the fleet database: {scrub(first[:200], url)}",
            hint="give a new database, or one `edgekit fleet collect` made",
        ) from None
    except BaseException:
        db.close()
        raise
    return db


def _while_locked(fn: Any, conn: Any, patience_s: float = 30.0) -> None:
    """``fn()`` again while SQLite says the database is locked, for up to ``patience_s``. Its busy timeout does
    not cover every case: a read that must become a write after another connection committed (WAL's
    BUSY_SNAPSHOT) is refused at once, and a collector next to a busy one meets that on opening the file."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fn()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            if conn.in_transaction:
                conn.rollback()
            time.sleep(0.05)


_USERINFO_PASSWORD = re.compile(r"(://[^:/@?#]*):[^@/?#]*@")
_PARAM_PASSWORD = re.compile(r"(?i)(password|passfile|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)")


def redact(url: str) -> str:
    """``url`` with every password in it (``user:pw@``, ``?password=``, ``password=...`` key/values) as ``***``."""
    url = _USERINFO_PASSWORD.sub(r"\1:***@", url)
    return _PARAM_PASSWORD.sub(r"\1\2***", url)


def scrub(message: str, url: str) -> str:
    """A driver's message with the URL's passwords taken out (a driver may quote the URL it could not parse)."""
    secrets: set[str] = set()
    try:
        u = urlparse(url)
        if u.password:
            secrets |= {u.password, unquote(u.password)}
    except ValueError:
        m = re.search(r"://[^:/@?#]*:([^@/?#]*)@", url)
        if m:
            secrets |= {m.group(1), unquote(m.group(1))}
    for m in _PARAM_PASSWORD.finditer(url):
        v = m.group(3).strip("'")
        secrets |= {v, unquote(v)}
    message = message.replace(url, redact(url))
    for secret in sorted((x for x in secrets if x and x != "***"), key=len, reverse=True):
        message = message.replace(secret, "***")
    return redact(message)
