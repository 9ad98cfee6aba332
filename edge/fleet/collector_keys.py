"""Births and deaths judged against the device's pinned key before they are stored (a part of
``edge.fleet.collector.Collector``; the rules: ``edge.fleet.device_keys``)."""

from __future__ import annotations

from edge.fleet.collector_config import CollectorState
from edge.fleet.decode import Decoded
from edge.fleet.device_keys import pin_first, pinned_key, record_refusal
from edge.mqtt.identity import key_id


class Keys(CollectorState):
    def _key_refusal(self, d: Decoded, now: float) -> str | None:
        """Why this birth or death is refused against the device's pinned key (``unsigned``, ``wrong_key``,
        ``bad_signature``), None when it may be stored. A device with no pin: a verified signed birth pins its key;
        an unsigned message is stored as before (an agent from before device keys). One query per birth or death
        (never cached: an operator's trust-key or forget-key holds at once, in every collector)."""
        s, db = d.signed, self.db
        pin = pinned_key(db, d.fleet, d.device)
        if pin is None:
            if s is None:
                return None
            if not s.verifies_with(s.key):
                return self._refuse(d, "bad_signature", now, pinned=False)
            if d.kind != "birth":  # only a birth pins; a death of an unpinned device is as good as unsigned
                return None
            pin = pin_first(db, d.fleet, d.device, s.key, now)
            if pin == s.key:
                self._ratelog.info(
                    "pinned", "%s/%s: pinned its device key %s (first signed birth)", d.fleet, d.device, key_id(pin)
                )
                return None
            # another collector pinned another key a moment ago: judged against that one
        if s is None:
            return self._refuse(d, "unsigned", now)
        if s.key != pin:
            return self._refuse(d, "wrong_key", now)
        if not s.verifies_with(pin):
            return self._refuse(d, "bad_signature", now)
        return None

    def _refuse(self, d: Decoded, reason: str, now: float, *, pinned: bool = True) -> str:
        if pinned:
            record_refusal(self.db, d.fleet, d.device, reason, d.signed.key if d.signed else None, now)
        claimed = key_id(d.signed.key) if d.signed else "none"
        self._ratelog.warning(
            reason,
            "%s/%s session %d connection %s: refused a %s (%s; it names key %s%s)",
            d.fleet,
            d.device,
            d.session,
            d.connection,
            d.kind,
            reason,
            claimed,
            "; flagged in fleet status" if pinned else "; the device has no pinned key",
        )
        return reason
