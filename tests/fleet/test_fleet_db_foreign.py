"""Issue #33 red team: a fleet database edgekit cannot use is one line, exit 2 (was an internal error, exit 3).

``fleet status --db sqlite:////dev/null`` ("disk I/O error"), a directory ("unable to open database file"), a
SQLite file and a real PostgreSQL database that hold another program's tables ("no such column") each printed
``internal error in fleet status``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.cli import assert_user_error, run_cli
from tests.support.pg_server import PostgresServer, PostgresUnavailable

FOREIGN = ("CREATE TABLE devices (serial TEXT, owner TEXT)", "CREATE TABLE meta (a INTEGER)")


def test_dev_null_and_a_directory_as_the_database(tmp_path: Path) -> None:
    assert_user_error(run_cli("fleet", "status", "--db", "sqlite:////dev/null"), "/dev/null is not a regular file")
    (tmp_path / "dir").mkdir()
    p = run_cli("fleet", "status", "--db", f"sqlite:///{tmp_path / 'dir'}")
    assert_user_error(p, "is not a regular file")


def test_a_sqlite_file_with_another_programs_tables(tmp_path: Path) -> None:
    f = tmp_path / "other.db"
    with sqlite3.connect(f) as c:
        for stmt in FOREIGN:
            c.execute(stmt)
    assert_user_error(run_cli("fleet", "status", "--db", f"sqlite:///{f}"), "cannot be used as the fleet database")


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'edgekit-ml[fleet]')")
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    with server as url:
        with psycopg.connect(url, autocommit=True) as c:
            for stmt in FOREIGN:
                c.execute(stmt)
        yield url


def test_a_postgresql_database_with_another_schema(postgres_url: str) -> None:
    p = run_cli("fleet", "status", "--db", postgres_url)
    assert_user_error(p, "cannot be used as the fleet database")
