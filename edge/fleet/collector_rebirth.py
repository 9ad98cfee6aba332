"""The collector asks a device whose state it does not know (no birth seen for its session) for a rebirth, at most once per ``rebirth_interval_s`` (a part of ``edge.fleet.collector.Collector``)."""

from __future__ import annotations

import logging
import time

from edge.fleet.collector_config import CollectorState
from edge.mqtt.payloads import SCHEMA_VERSION, encode
from edge.mqtt.topics import Topic

log = logging.getLogger("edge.fleet")


class Rebirth(CollectorState):
    # state unknown -> rebirth ------------------------------------------------------------
    def _check_known(self, fleet: str, device: str, session: int, known: int | None) -> None:
        """Ask for a rebirth when no birth is known for ``session`` (``known``: the latest birth session known,
        from ``_birth_sessions``, which already asked the store)."""
        if known is None or known < session:
            self.request_rebirth(fleet, device, f"no birth seen for session {session}")

    def request_rebirth(self, fleet: str, device: str, reason: str) -> bool:
        if self.loop is not None and self._writer is not None and not self.loop.in_loop:
            self.loop.call_soon(self.request_rebirth, fleet, device, reason)  # the writer: MQTT is the loop's
            return False
        key = (fleet, device)
        now = time.monotonic()
        if now - self._rebirth_at.get(key, -1e9) < self.config.rebirth_interval_s:
            return False
        if self.conn is None or not self.conn.connected:
            return False
        self._rebirth_at[key] = now
        body = {
            "schema_version": SCHEMA_VERSION,
            "type": "cmd",
            "command": "rebirth",
            "fleet": fleet,
            "device": device,
            "reason": reason,
            "ts": round(time.time(), 6),
        }
        self.conn.publish(str(Topic(fleet, device, "cmd", "rebirth")), encode(body), qos=1)
        self.stats["rebirths_sent"] += 1
        self._ratelog.info("rebirth", "asked %s/%s for a rebirth (%s)", fleet, device, reason)
        return True
