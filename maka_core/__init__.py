"""maka_core: the ledger and everything that reasons about it. Never imports temporalio.

Facts and their wire form
    events (RuntimeEvent models), event_payloads (nested payload shapes), canonical_json
    (JavaScript-semantics JSON), codec (decode/encode, canonicalArgsHash), errors (one tree).
Interpretation (one scanner for writers, rebuild and the Resolver)
    lanes, scanner, recovery_bundle, resolver (RecoveryResolver), resume_plan (Phase 0),
    projections (tool_operations / tool_journal_events rows).
The store (SQLAlchemy Core; SQLite by default, Postgres through the same code)
    engine (pragmas, BEGIN IMMEDIATE, error translation), schema (tables, user_version),
    store (the writers: append, T1, T2, recovery bundle, terminal, import), store_reads,
    ledger_rows, run_store + runs (AgentRun headers, startup repair), continuation_store + claims,
    ledger_io (JSONL import/export).
Execution
    workspace (identity marker, confinement), tools (read/list/write/edit/bash with evidence and
    reconcilers), policy (before the effect), providers (scripted, OpenAI-compatible),
    session_view (status and transcript from the ledger), failpoints, paths.
"""
