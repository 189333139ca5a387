"""The workflow sandbox, kept on, without recompiling its glue code on every call.

temporalio 1.35's ``SandboxedWorkflowRunner`` enters its sandbox by ``exec`` of a small source
string, and it does so for every activation and, through the command-aware data converter, for
every payload sequence it decodes or encodes (``get_serialization_context``,
``get_external_store_context``): several times per workflow task. ``exec`` of a string compiles
it each time; under 20 concurrent sessions that compile was ~12 % of the worker's CPU (py-spy,
GIL-holding samples). The strings are a handful of constants, so each is compiled once here and the
code object is executed instead: the same code, the same globals, the same restrictions.

Passing more modules through the sandbox was measured and does not pay: with the default
restrictions, the only modules a session run imports afresh are the workflow's own package and
module (which must stay per-run) and the SDK's ``_in_sandbox``; everything else the workflow
imports is already passed through (stdlib, temporalio, and ``workflows.contracts`` with
pydantic under ``imports_passed_through``).
"""

from __future__ import annotations

import functools
from types import CodeType
from typing import Any

from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance


@functools.lru_cache(maxsize=64)
def compiled(source: str) -> CodeType:
    """The snippet's code object (the filename is ``exec``'s own, so tracebacks read the same)."""
    return compile(source, "<string>", "exec")


class _CompiledOnceInstance(_Instance):
    def _run_code(self, code: Any, **extra_globals: Any) -> None:
        # exec takes a code object as readily as its source; the parent's annotation says str.
        super()._run_code(compiled(code) if isinstance(code, str) else code, **extra_globals)  # type: ignore[arg-type]


class CompiledOnceSandboxRunner(SandboxedWorkflowRunner):
    """``SandboxedWorkflowRunner`` (same restrictions, same per-run module isolation) whose
    sandbox-entry snippets are compiled once per process."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledOnceInstance(det, self.runner_class, self.restrictions)
