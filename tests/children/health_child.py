"""Run in a private mount namespace (``unshare -m``): put a ledger on a real tmpfs that fills up or
turns read-only, and print what the store says as one JSON object.

Usage: ``unshare -m python -m tests.children.health_child MODE DIR`` with MODE ``full``,
``readonly_fs``, ``readonly_file`` or ``status``. ``control`` as a third argument runs the same steps on an
ordinary (large, writable) tmpfs, the negative control.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from maka_core.errors import MakaError
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import text, user


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def attempt(fn: Any) -> str:
    try:
        fn()
    except MakaError as exc:
        return exc.code
    return "ok"


def main(mode: str, root: Path, control: bool) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    size = "64m" if control else "4m" if mode == "status" else "1m"
    mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root))
    ledger = root / "ledger.sqlite"
    out: dict[str, Any] = {"mode": mode}
    if mode == "status":
        return status(root, ledger, control)
    if mode == "full":
        store = LedgerStore.open(ledger)
        store.append([user()])
        codes = [
            attempt(lambda i=i: store.append([text("x" * 20000, id=f"evt-fill-{i}")])) for i in range(80)
        ]
        out["firstFailure"] = next((c for c in codes if c != "ok"), "ok")
        out["writesBeforeFailure"] = codes.index(out["firstFailure"]) if out["firstFailure"] != "ok" else 80
        out["health"] = store.health.to_json()
        # Sticky: freeing room does not make this store trust the file again.
        subprocess.run(["sh", "-c", f"rm -f {root}/filler"], check=False)
        out["after"] = attempt(lambda: store.append([text("y", id="evt-after")]))
        store.close()
        return out
    with LedgerStore.open(ledger) as store:
        store.append([user()])
    if mode == "readonly_fs":
        if not control:
            mount("-o", "remount,ro", str(root))
        out["open"] = attempt(lambda: LedgerStore.open(ledger).close())
        return out
    # readonly_file: the file alone is mounted read-only over itself; its directory stays writable.
    if not control:
        mount("--bind", str(ledger), str(ledger))
        mount("-o", "remount,bind,ro", str(ledger))
    store = LedgerStore.open(ledger)
    out["read"] = [e.id for e in store.events()]
    out["check"] = attempt(store.check_health)
    out["write"] = attempt(lambda: store.append([text(id="evt-model-1")]))
    out["health"] = store.health.to_json()
    store.close()
    return out


def status(root: Path, ledger: Path, control: bool) -> dict[str, Any]:
    """``maka session status --json`` (no Temporal reachable: the ledger answers) on a ledger whose
    disk is nearly full, then on a read-only file system."""
    from click.testing import CliRunner

    from maka_temporal.workers.cli.app import maka

    with LedgerStore.open(ledger) as store:
        store.append([user()])
    if not control:
        # Leave less than the 1 MiB status asks for, but room for the reader's WAL index.
        st = os.statvfs(root)
        (root / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (256 << 10)))
    env = {"MAKA_HOME": str(root), "TEMPORAL_ADDRESS": "127.0.0.1:1", "MAKA_DB": None}

    def run() -> dict[str, Any]:
        result = CliRunner().invoke(
            maka, ["session", "status", "--db", str(ledger), "--json", "sess-1"], env=env
        )
        body = json.loads(result.stdout)
        return {"exit": result.exit_code, "ledger": body.get("ledger"), "code": body.get("code")}

    out = {"full": run()}
    if not control:
        mount("-o", "remount,ro", str(root))
    out["readonly"] = run()
    return out


if __name__ == "__main__":
    result = main(sys.argv[1], Path(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "control")
    print(json.dumps(result), flush=True)
    # ``status`` ran the CLI in this process and tried Temporal: leave as ``maka`` itself does
    # (``workers.cli.app.main``), without interpreter finalization under the Temporal core's threads,
    # which once aborted this child after its correct answer (PyGILState_Release while finalizing).
    os._exit(0)
