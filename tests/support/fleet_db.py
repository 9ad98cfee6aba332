"""Reading a collector's SQLite database from a test while the collector writes it."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def count(db: Path, sql: str) -> int:
    """``sql``'s first column of its first row as an int; 0 while the database or its tables do not exist yet."""
    try:
        with sqlite3.connect(db, timeout=10) as c:
            return int(c.execute(sql).fetchone()[0]) if db.exists() else 0
    except sqlite3.OperationalError:
        return 0
