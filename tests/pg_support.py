"""A throwaway PostgreSQL ledger per test or drill: a fresh schema on ``MAKA_TEST_POSTGRES_URL``.

The store reaches its schema through ``search_path`` in the URL (``options=-csearch_path=...``), so a
ledger URL is self-contained: a worker process, ``maka ledger verify --db URL`` and the test all name
the same ledger by the same string. ``application_name`` tags the connections so a drill can find
(and terminate) exactly one store's backends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text

ENV = "MAKA_TEST_POSTGRES_URL"
SKIP_REASON = f"PostgreSQL ledger: {ENV} is not set (scripts/test starts a throwaway server)"


def pg_base_url() -> str | None:
    return os.environ.get(ENV) or None


def schema_url(base: str, schema: str, *, app: str | None = None) -> str:
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options=-csearch_path%3D{schema}"
    return url if app is None else f"{url}&application_name={app}"


@contextmanager
def fresh_pg_schema(*, app: str | None = None, keep: bool = False) -> Iterator[str]:
    """A ledger URL on a new, empty schema (dropped afterwards unless ``keep``)."""
    base = pg_base_url()
    if base is None:
        raise RuntimeError(SKIP_REASON)
    schema = "maka_test_" + uuid.uuid4().hex[:12]
    admin = create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        yield schema_url(base, schema, app=app)
        if not keep:
            with admin.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    finally:
        admin.dispose()


def terminate_backends(app: str) -> int:
    """``pg_terminate_backend`` every connection tagged ``application_name=app``; how many."""
    base = pg_base_url()
    assert base is not None
    admin = create_engine(base)
    try:
        with admin.begin() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :app AND pid <> pg_backend_pid()"
                    ),
                    {"app": app},
                ).all()
            )
    finally:
        admin.dispose()
