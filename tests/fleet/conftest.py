"""Fixtures for the fleet's tests: a Mosquitto of the test's own (``broker``) and PostgreSQL.

One throw-away PostgreSQL server serves the whole run (started on first use: initdb and start cost seconds on a
loaded host); each test that asks for ``postgres_url`` gets a fresh, empty database on it, so no test sees
another's rows. Skips with the reason where no server can start (a failure under CI=true: tests/conftest.py).
"""

from __future__ import annotations

import itertools
import re
from typing import Iterator

import pytest

from tests.support.mqtt_broker import broker
from tests.support.pg_server import PostgresServer, PostgresUnavailable

__all__ = ["broker", "postgres_server", "postgres_url"]

_DATABASES = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of the run's PostgreSQL server (its ``postgres`` database)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'edgekit-ml[fleet]')")
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    with server as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database of this test's own on the run's server."""
    import psycopg

    name = f"t{next(_DATABASES)}_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    with psycopg.connect(postgres_server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return postgres_server.rsplit("/", 1)[0] + "/" + name
