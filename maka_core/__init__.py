"""maka_core: the ledger, the runtime that speaks through it, and everything that reasons about it.
Never imports temporalio; every turn can run without an orchestrator (``tests/test_runtime.py``).

facts/      what is written: RuntimeEvents and payload shapes, canonical JSON (JavaScript
            semantics), the codec and ``canonicalArgsHash``, run headers, continuation claims, clock.
ledger/     what it means, pure: the one scanner (lanes, recovery bundles), the Resolver, the Phase 0
            plan, projections, the committed view the runtime reads, and the Phase 1 continuation
            planner (continuation, lineage, digests, provider replay, continuation start, the
            offline document).
store/      where it lives: the typed ``Ledger`` interface and its SQLAlchemy Core implementation
            (SQLite by default, PostgreSQL through the same code): engine, schema, writers, the hot
            path's driver SQL, reads, run headers, claims, JSONL import/export.
runtime/    the turn protocol: begin/finish a run, a model step, a tool call from guard to T2,
            recovery, settling a run (shared by finish and repair), the events it writes, its
            contract models and closed sets, its services and threads, the session view.
tools/      the built-in tools with their evidence and reconcilers, the bash sandbox, the race-free
            path resolver.   providers/  scripted and OpenAI-compatible models.
governance/ MELRA's policy, approval challenge, evidence, guarantees and receipts (pure).
checkpoints/ Phase 4 workspace checkpoints: the boundary contract and bundle, the Git carrier
            (capture, verify, diff, isolated restore, retention), what a continuation would observe
            at a boundary. Not wired into the runtime yet.
policy, workspace, settings, observe, failpoints, paths, errors: one module each.
"""
