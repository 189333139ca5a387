"""Shared pytest fixtures. Each helper appends its own section, marked with its owner."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- ledger store (helper B) ---------------------------------------------------------------
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace

#: Backends the store contract suite runs on. Postgres joins when MAKA_TEST_POSTGRES_URL is set.
STORE_BACKENDS = ["sqlite-file", "sqlite-memory", "postgres"]


def _postgres_url() -> str | None:
    return os.environ.get("MAKA_TEST_POSTGRES_URL") or None


@pytest.fixture(params=["sqlite-file", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger that several stores or processes open at once: a SQLite file's path, or a URL
    on a new PostgreSQL schema (dropped afterwards)."""
    from tests.pg_support import SKIP_REASON, fresh_pg_schema, pg_base_url

    if request.param == "sqlite-file":
        yield str(tmp_path / "ledger.sqlite")
        return
    if pg_base_url() is None:
        pytest.skip(SKIP_REASON)
    with fresh_pg_schema() as url:
        yield url


@pytest.fixture(params=STORE_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger URL per backend (Postgres: a fresh schema, dropped afterwards)."""
    if request.param == "sqlite-file":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    elif request.param == "sqlite-memory":
        yield "sqlite://"
    else:
        base = _postgres_url()
        if base is None:
            pytest.skip("Postgres backend: MAKA_TEST_POSTGRES_URL is not set")
        from sqlalchemy import create_engine, text

        schema = "maka_test_" + uuid.uuid4().hex[:12]
        admin = create_engine(base)
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        sep = "&" if "?" in base else "?"
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture
def store(store_url: str) -> Iterator[LedgerStore]:
    s = LedgerStore.open(store_url)
    yield s
    s.close()


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """An empty workspace at ``tmp_path/ws`` (a test module may define its own)."""
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace.open(root)


@pytest.fixture
def rt(store: LedgerStore) -> Iterator[Runtime]:
    """The runtime without Temporal, over ``store`` (every backend ``store_url`` gives)."""
    runtime = Runtime(store)
    yield runtime
    runtime.close()


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    """A SQLite ledger file path (not yet created)."""
    return tmp_path / "ledger.sqlite"


# --- end of ledger store (helper B) --------------------------------------------------------


# --- Temporal (helper C) -------------------------------------------------------------------

from collections.abc import AsyncIterator  # noqa: E402

import pytest_asyncio  # noqa: E402


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[object]:
    """One dev server for the whole test session, started exactly as ``maka dev`` starts it
    (in memory; its own free ports)."""
    from maka_temporal.workers.host import devserver

    server = devserver.start(ui=False, db_file=None)
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal_client(temporal_server: object) -> AsyncIterator[object]:
    from maka_temporal.workers.client.connect import connect

    yield await connect(temporal_server.address)  # type: ignore[attr-defined]


@pytest.fixture
def task_queue() -> str:
    """A fresh task queue per test, so tests never share workers."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def ws_dir(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


# --- end of Temporal (helper C) ------------------------------------------------------------
