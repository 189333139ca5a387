"""The worker's sandbox runner: still a sandbox (restrictions enforced, the workflow module imported
afresh per run) while its entry snippets are compiled once."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import (
    RestrictedWorkflowAccessError,
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)
from temporalio.worker.workflow_sandbox._runner import _Instance
from temporalio.workflow import _Definition

from maka_temporal.workers.host.sandbox_runner import (
    CompiledOnceSandboxRunner,
    WorkflowModules,
    compiled,
    compiled_module,
)
from tests.children.sandbox_probe_clock import ImportsTheClock
from tests.children.sandbox_probe_runs import CountsRuns


def _prepare(runner: WorkflowRunner, cls: type[Any]) -> None:
    async def go() -> None:
        runner.prepare_workflow(_Definition.must_from_class(cls))

    asyncio.run(go())


def _run_classes(runner_cls: type[SandboxedWorkflowRunner], n: int, **kwargs: Any) -> list[type[Any]]:
    """The workflow class each of ``n`` sandboxed runs executes."""
    seen: list[type[Any]] = []

    class Capturing(runner_cls):  # type: ignore[valid-type,misc]
        def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
            instance = super().create_instance(det)
            seen.append(instance.globals_and_locals["__temporal_workflow_class"])
            return instance

    runner = Capturing(**kwargs)
    for _ in range(n):
        _prepare(runner, CountsRuns)
    return seen


def test_restrictions_still_apply() -> None:
    with pytest.raises(RestrictedWorkflowAccessError):
        _prepare(CompiledOnceSandboxRunner(), ImportsTheClock)


def test_negative_control_unsandboxed_runner_lets_the_clock_through() -> None:
    # The probe can fail: without a sandbox the same module imports cleanly.
    _prepare(UnsandboxedWorkflowRunner(), ImportsTheClock)


@pytest.mark.parametrize("runner_cls", [SandboxedWorkflowRunner, CompiledOnceSandboxRunner])
def test_workflow_module_is_imported_afresh_per_run(runner_cls: type[SandboxedWorkflowRunner]) -> None:
    # Each run executes its own copy of the module: none is the host's class, no two are the same.
    classes = _run_classes(runner_cls, 3)
    assert CountsRuns not in classes
    assert len({id(c) for c in classes}) == 3


def test_negative_control_a_passed_through_workflow_module_is_shared() -> None:
    shared = SandboxRestrictions.default.with_passthrough_modules("tests.children.sandbox_probe_runs")
    assert _run_classes(CompiledOnceSandboxRunner, 2, restrictions=shared) == [CountsRuns, CountsRuns]


def test_entry_snippets_compile_once() -> None:
    runner = CompiledOnceSandboxRunner()
    _prepare(runner, CountsRuns)
    info = compiled.cache_info()
    _prepare(runner, CountsRuns)
    after = compiled.cache_info()
    assert after.misses == info.misses
    assert after.hits > info.hits


def _run_codes(runner_cls: type[SandboxedWorkflowRunner], n: int) -> list[Any]:
    """The code object of the workflow's ``run`` in each of ``n`` sandboxed runs."""
    return [cls.run.__code__ for cls in _run_classes(runner_cls, n)]


def test_the_workflow_module_is_compiled_once_and_executed_per_run() -> None:
    codes = _run_codes(CompiledOnceSandboxRunner, 3)
    # One compilation serves every run (the classes are still distinct: see the test above).
    assert len({id(c) for c in codes}) == 1, codes
    info = compiled_module.cache_info()
    _run_codes(CompiledOnceSandboxRunner, 2)
    assert compiled_module.cache_info().misses == info.misses, (info, compiled_module.cache_info())


def test_negative_control_the_stock_runner_loads_the_module_code_per_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The check above can fail: the stock sandbox compiles (or unmarshals) the module every run, so
    # no two runs share a code object. The finder is process-wide once a runner of ours prepared a
    # workflow of that package, so the stock runner runs here with it taken off the import path.
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, WorkflowModules)])
    codes = _run_codes(SandboxedWorkflowRunner, 3)
    assert len({id(c) for c in codes}) == 3, codes


def test_serialization_contexts_match_the_sandboxed_lookup() -> None:
    # The lookups are the SDK's own in-sandbox methods, called directly instead of through exec.
    instances: list[Any] = []

    class Capturing(CompiledOnceSandboxRunner):
        def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
            instances.append(super().create_instance(det))
            return instances[-1]

    _prepare(Capturing(), CountsRuns)
    (instance,) = instances
    ours = instance.get_serialization_context(None)
    assert ours is not None
    assert ours == _Instance.get_serialization_context(instance, None)
    assert instance.get_external_store_context(None) == _Instance.get_external_store_context(instance, None)
