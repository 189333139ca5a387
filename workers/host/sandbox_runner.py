"""The workflow sandbox, kept on, without its per-payload entry cost or a compile per run.

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

A third change, for the workflow's own modules, which the sandbox must import afresh for every run
(its isolation): each is compiled once per process and its code object executed per run. Without
bytecode files (an editable install, ``PYTHONDONTWRITEBYTECODE``) the import compiled the 600-line
session module every time a session started: a session's sandboxed instance took 3.1-3.2 ms to
create on the project's VM, 0.9 ms with this; with bytecode files it still read and unmarshalled
one. ``WorkflowModules``, a finder scoped to the packages of the
workflows this runner prepares, hands the import system a loader whose ``get_code`` compiles each
module's source once (keyed by its bytes, so an edited file is compiled again). Module execution, and
so isolation, is unchanged.

This leans on two private names of the pinned SDK (``_Instance`` and its ``_run_code``,
``__temporal_in_sandbox``); ``tests/test_sandbox_runner.py`` pins the behaviour (restrictions still
refuse, the workflow module is still imported per run from one compilation, the contexts equal the
sandboxed lookup).

Passing more modules through the sandbox was measured and does not pay: with the default
restrictions, the only modules a session run imports afresh are the workflow's own package and
module (which must stay per-run) and the SDK's ``_in_sandbox``; everything else the workflow
imports is already passed through (stdlib, temporalio, and ``workflows.contracts`` with
pydantic under ``imports_passed_through``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import Any, cast

from temporalio.converter import SerializationContext, StorageDriverStoreContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance
from temporalio.workflow import _Definition


@functools.lru_cache(maxsize=64)
def compiled(source: str) -> CodeType:
    """The snippet's code object (the filename is ``exec``'s own, so tracebacks read the same)."""
    return compile(source, "<string>", "exec")


@functools.lru_cache(maxsize=64)
def compiled_module(source: bytes, path: str) -> CodeType:
    """A module's code object, as the import system compiles it (``dont_inherit``: this module's own
    ``from __future__`` flags must not leak into the workflow's code)."""
    return compile(source, path, "exec", dont_inherit=True)


class _CompiledOnceLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str) -> CodeType:
        return compiled_module(self.get_data(self.path), self.path)


class WorkflowModules(importlib.abc.MetaPathFinder):
    """Finds the modules of the top-level packages in ``packages`` with ``_CompiledOnceLoader``;
    every other import is left to the finders after this one."""

    def __init__(self) -> None:
        self.packages: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.packages:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return spec
        assert spec.origin is not None
        spec.loader = _CompiledOnceLoader(fullname, spec.origin)
        return spec


def _workflow_modules() -> WorkflowModules:
    """The one finder of this process, installed on first use right before the path finder it
    stands in for (import hooks placed before that one, such as pytest's assertion rewriter, keep
    their turn)."""
    for finder in sys.meta_path:
        if isinstance(finder, WorkflowModules):
            return finder
    finder = WorkflowModules()
    at = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path)
    )
    sys.meta_path.insert(at, finder)
    return finder


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

    def prepare_workflow(self, defn: _Definition) -> None:
        # Before the SDK's validation run imports the module in a sandbox for the first time.
        _workflow_modules().packages.add(defn.cls.__module__.partition(".")[0])
        super().prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledOnceInstance(det, self.runner_class, self.restrictions)
