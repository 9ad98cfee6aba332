"""The collector's batching: when a batch is written, the writer thread (pipeline), commits, acknowledgements, failures, and the flow control of the socket while the backlog is full (a part of ``edge.fleet.collector.Collector``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from edge.fleet.collector_config import CollectorState
from edge.fleet.db import scrub

log = logging.getLogger("edge.fleet")


class Batching(CollectorState):
    # committing --------------------------------------------------------------------------
    def flush(self) -> None:
        """Write what is queued, commit, then acknowledge what the commit made durable; then look at the
        streams touched."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inflight:  # the writer's batch first: its commit and PUBACKs come before this one's
            self._idle.wait()
            self._complete()
            if self._broken:
                return
        self._batch_t0 = None
        if not self._pending and not self._uncommitted and not self._acks:
            return
        try:
            self._write()
            self._check_gaps()
            self.db.commit()
        except Exception as e:
            self._db_failed(e)
            return
        self._uncommitted = 0
        self._tally = {}
        acks, self._acks = self._acks, []
        self._acknowledge(acks)

    def _acknowledge(self, acks: list[tuple[Any, int, int]]) -> None:
        """Loop thread: a committed batch's PUBACKs, in order."""
        if self.conn is not None:
            for client, mid, qos in acks:
                self.conn.ack(client, mid, qos)
            done = getattr(self.conn, "ack_done", None)  # the lean client: the batch's PUBACKs in one write
            if done is not None:
                done()

    def _after_io(self) -> None:
        """After every round of socket events: commit the open batch when it is due, else wake up when it is.
        Pipelined, a batch is due as soon as the writer is free (group commit: what arrived while the last batch
        was committing goes in the next one, so batches grow with the load and a quiet fleet waits for nothing;
        a broker that sends few unacknowledged messages at a time, such as RabbitMQ's default prefetch of 10, is
        not held to one batch per interval)."""
        if self._paused_client is not None:
            self._resume_reading()
        if self._batch_t0 is None:
            return
        wait = self.config.batch_interval_ms / 1000.0 - (time.monotonic() - self._batch_t0)
        if wait <= 0 or (self._writer is not None and not self._inflight):
            self._batch_due()
        elif self._timer is None and self.loop is not None:
            self._timer = self.loop.call_later(wait, self._due)

    def _batch_due(self) -> None:
        """The open batch is full or old enough: to the writer (pipelined), else written here."""
        if self._writer is None:
            self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inflight:  # the writer is busy: this batch goes when it is done (_complete)
            return
        self._batch_t0 = None
        if not self._pending and not self._acks:
            return
        pending, acks = self._pending, self._acks
        self._pending, self._acks = [], []
        self._inflight = True
        self._idle.clear()
        self._batches.put((pending, acks))

    def _write_batches(self) -> None:
        """The writer thread: write, look at the gaps, commit; then the loop thread acknowledges (``_complete``)."""
        while True:
            item = self._batches.get()
            if item is None:
                return
            pending, acks = item
            error: BaseException | None = None
            try:
                self._write(pending)
                self._check_gaps()
                self.db.commit()
                self._uncommitted = 0
                self._tally = {}
            except Exception as e:  # handled on the loop thread (_complete -> _db_failed)
                error = e
            self._done = (acks, error)
            self._idle.set()
            loop = self.loop
            if loop is not None:
                loop.call_soon(self._complete)

    def _complete(self) -> None:
        """Loop thread: the writer's batch is committed (acknowledge it) or failed (roll back, reconnect)."""
        if not self._idle.is_set():  # the writer is still finishing: its own call comes next
            return
        done, self._done = self._done, None
        if done is None:  # already completed by a flush
            return
        self._inflight = False
        acks, error = done
        if error is not None or self._broken:
            self._broken = False
            self._db_failed(error if error is not None else RuntimeError("failed while a batch was being written"))
            return
        self._acknowledge(acks)
        if len(self._acks) >= self.config.batch_max:
            self._batch_due()
        else:
            self._after_io()

    def _due(self) -> None:
        self._timer = None  # the loop runs _after_io right after its timers

    def _db_failed(self, e: BaseException) -> None:
        """Roll back and drop the connection: the broker re-delivers everything not yet acknowledged."""
        if self._inflight:  # the writer holds the database: drop the connection now, clean up after its batch
            self._broken = True
            self._acks.clear()
            self._pending.clear()
            if self.conn is not None and self.conn.client is not None:
                self.conn.client.disconnect()
            log.error(
                "error while a batch was being written, reconnecting for re-delivery: %s",
                scrub(str(e), self.config.db_url),
            )
            return
        self.stats["db_errors"] += 1
        log.error(
            "database error, rolling back and reconnecting for re-delivery: %s", scrub(str(e), self.config.db_url)
        )
        try:
            self.db.rollback()
        except Exception:  # pragma: no cover - the connection itself is gone
            pass
        tally, self._tally = self._tally, {}
        for key, n in tally.items():  # rolled back: counted again when re-delivered
            if key == "duplicates":
                self.stats["duplicates"] -= n
            elif key in self.stats["rejected"]:  # seq_jump, or a birth/death refused against its device's key
                self.stats["rejected"][key] -= n
            else:
                self.stats["stored"][key] -= n
        self._acks.clear()
        self._pending.clear()
        self._uncommitted = 0
        self._touched.clear()
        if self.conn is not None and self.conn.client is not None:
            self.conn.client.disconnect()

    def _pause_reading(self) -> None:
        client = self.conn.client if self.conn is not None else None
        if self.loop is None or client is None or self._paused_client is client:
            return
        self.loop.pause_reading(client, True)
        self._paused_client = client
        self.stats["read_pauses"] += 1
        self._ratelog.info(
            "paused",
            "backlog full (%d messages waiting for the database): not reading from the broker until the writer "
            "catches up (%d pauses so far)",
            len(self._pending),
            self.stats["read_pauses"],
        )

    def _resume_reading(self) -> None:
        """Loop thread, after every round: read again once the backlog is below the bound."""
        client, loop = self._paused_client, self.loop
        if client is not None and len(self._pending) < self.config.max_backlog:
            self._paused_client = None
            if loop is not None:
                loop.pause_reading(client, False)
