"""The workflow sandbox, kept on, without its per-payload entry cost.

temporalio 1.35's ``SandboxedWorkflowRunner`` enters its sandbox by ``exec`` of a small source
string, with its importer applied, for every activation and, through the command-aware data
converter, for every payload sequence it decodes or encodes (``get_serialization_context``,
``get_external_store_context``): several times per workflow task. Under 20 concurrent sessions
those entries were ~20 % of the GIL-holding samples (py-spy), mostly compiling the string and
swapping the importer in and out. Two changes, measured together at -15 % worker CPU there:

- every snippet is compiled once and its code object executed: the same code, globals and
  restrictions (workflow code, activations and instance creation still run inside the sandbox);
- the two context lookups call the SDK's in-sandbox object directly: they are its own dictionary
  lookups over the workflow's pending commands (no workflow code, no import), so entering the
  sandbox for them guards nothing.

This leans on two private names of the pinned SDK (``_Instance`` and its ``_run_code``,
``__temporal_in_sandbox``); ``tests/test_sandbox_runner.py`` pins the behaviour (restrictions still
refuse, the workflow module is still imported per run, the contexts equal the sandboxed lookup).

Passing more modules through the sandbox was measured and does not pay: with the default
restrictions, the only modules a session run imports afresh are the workflow's own package and
module (which must stay per-run) and the SDK's ``_in_sandbox``; everything else the workflow
imports is already passed through (stdlib, temporalio, and ``workflows.contracts`` with
pydantic under ``imports_passed_through``).
"""

from __future__ import annotations

import functools
from types import CodeType
from typing import Any, cast

from temporalio.converter import SerializationContext, StorageDriverStoreContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance


@functools.lru_cache(maxsize=64)
def compiled(source: str) -> CodeType:
    """The snippet's code object (the filename is ``exec``'s own, so tracebacks read the same)."""
    return compile(source, "<string>", "exec")


class _CompiledOnceInstance(_Instance):
    def get_serialization_context(self, command_info: CommandInfo | None) -> SerializationContext | None:
        return cast("SerializationContext | None", self._in_sandbox().get_serialization_context(command_info))

    def get_external_store_context(self, command_info: CommandInfo | None) -> StorageDriverStoreContext:
        return cast(StorageDriverStoreContext, self._in_sandbox().get_external_store_context(command_info))

    def _in_sandbox(self) -> Any:
        return self.globals_and_locals["__temporal_in_sandbox"]

    def _run_code(self, code: Any, **extra_globals: Any) -> None:
        # exec takes a code object as readily as its source; the parent's annotation says str.
        super()._run_code(compiled(code) if isinstance(code, str) else code, **extra_globals)  # type: ignore[arg-type]


class CompiledOnceSandboxRunner(SandboxedWorkflowRunner):
    """``SandboxedWorkflowRunner`` (same restrictions, same per-run module isolation) whose
    sandbox-entry snippets are compiled once per process."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledOnceInstance(det, self.runner_class, self.restrictions)
