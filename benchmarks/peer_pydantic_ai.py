"""Peer benchmark: pydantic-ai's Temporal integration running the same scripted session.

The installed pydantic-ai (benchmark-only extra ``bench``) is used the way its Temporal docs
prescribe: an ordinary ``Agent`` with the ``TemporalDurability`` capability, a workflow listing it in
``__pydantic_ai_agents__``, and ``PydanticAIPlugin`` on the client (pydantic payload converter, worker
registrations, sandbox pass-through). Inside the workflow every model request and every tool call is
an activity on the workflow's own task queue.

The model is a ``FunctionModel`` that replays the benchmark script: N model steps each asking for one
``read_file`` of the sample file, then a final text; the tool reads that file (5 KB by default) from
a temp workspace, the same work as a Maka ``read_file`` of that file. Nothing else is set: no
``continue_as_new`` handler (pydantic-ai offers one but does not enable it) and no usage limit, so
the run shows what a stock integration does with a long conversation: each model-request activity
carries the whole message history as its input, so history grows quadratically until the server
terminates the execution at 50 MB.

Run: ``python benchmarks/peer_pydantic_ai.py --calls 20 100`` (starts its own dev server, as
``maka dev`` does, unless ``--address`` names one).
"""

from __future__ import annotations

import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

if not workflow.unsafe.in_sandbox():  # run as `python benchmarks/<this file>` from a checkout
    _root = str(Path(__file__).resolve().parents[1])
    if _root not in sys.path:
        sys.path.insert(0, _root)

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import UsageLimits

    import benchmarks.bench_server as bench_server

SYSTEM = "pydantic-ai"
AGENT_NAME = "maka_peer_bench"
PROMPT_PREFIX = "read the sample file this many times: "


@dataclass
class PeerDeps:
    """Run dependencies (serialized into every activity's input by pydantic-ai)."""

    workspace: str


@dataclass(frozen=True)
class PeerInput:
    """Workflow input."""

    workspace: str
    n_calls: int


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The benchmark script: one ``read_file`` call per step until N results are in, then text.

    N comes from the user prompt and progress from the tool results in the conversation, so every
    step is a pure function of the messages the model-request activity receives.
    """
    target = done = 0
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    target = int(part.content.removeprefix(PROMPT_PREFIX))
                elif isinstance(part, ToolReturnPart):
                    done += 1
    if done < target:
        call = ToolCallPart("read_file", {"path": bench_server.SAMPLE_FILE}, tool_call_id=f"call-{done + 1}")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart(f"read {done} times")])


async def read_file(ctx: RunContext[PeerDeps], path: str) -> str:
    """Read a file in the workspace and return its text."""
    return (Path(ctx.deps.workspace) / path).read_text(encoding="utf-8")


agent = Agent(
    FunctionModel(scripted_model, model_name="maka-scripted"),
    name=AGENT_NAME,
    deps_type=PeerDeps,
    tools=[read_file],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="peer_pydantic_ai.session")
class PydanticAISession(PydanticAIWorkflow):  # type: ignore[misc]  # the optional extra is untyped
    """One agent run of the scripted session."""

    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, params: PeerInput) -> str:
        result = await agent.run(
            f"{PROMPT_PREFIX}{params.n_calls}",
            deps=PeerDeps(workspace=params.workspace),
            usage_limits=UsageLimits(request_limit=None),  # the default 50 requests would end long runs
        )
        return str(result.output)


def is_tool_activity(name: str) -> bool:
    """pydantic-ai's function-toolset call activity (``agent__<agent>__toolset__<id>__call_tool``)."""
    return name.startswith(f"agent__{AGENT_NAME}__") and name.endswith("call_tool")


def pydantic_ai_client(client: Client) -> Client:
    """``client``'s connection with ``PydanticAIPlugin`` added (its payload converter and registrations)."""
    config = client.config()
    plugins = [p for p in config.get("plugins", []) if not isinstance(p, PydanticAIPlugin)]
    config["plugins"] = [*plugins, PydanticAIPlugin()]
    return Client(**config)


async def run_pydantic_ai(
    client: Client,
    task_queue: str,
    n_calls: int,
    output_bytes: int = 5 * 1024,
    *,
    timeout: float = 600.0,
    warmup: bool = True,
) -> dict[str, Any]:
    """Run one N-call pydantic-ai session on its own worker and measure it.

    Starts a worker (with ``PydanticAIPlugin``) for ``PydanticAISession`` and the agent's activities on
    ``task_queue`` (give it a queue no other worker polls), runs an untimed 2-call warm-up, then the
    measured run.

    Args:
        client: a connected client; the plugin is added on a copy sharing its connection.
        task_queue: queue for this benchmark's worker.
        n_calls: sequential tool calls the scripted model asks for.
        output_bytes: size of each tool output.
        timeout: seconds before the measured workflow is terminated and reported incomplete.
        warmup: run the warm-up workflow first.

    Returns:
        The ``bench_server.measure`` dict with ``system="pydantic-ai"`` and ``output_bytes``; a session
        the server terminated for history size is ``completed=False`` with the reason in ``error``.
    """
    pai_client = pydantic_ai_client(client)
    workspace = bench_server.sample_workspace(output_bytes)

    def start(n: int) -> Any:
        return pai_client.start_workflow(
            PydanticAISession.run,
            PeerInput(workspace=str(workspace), n_calls=n),
            id=f"peer-pydantic-ai-{n}-{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
        )

    try:
        async with Worker(pai_client, task_queue=task_queue, workflows=[PydanticAISession]):
            if warmup:
                await (await start(2)).result()
            result = await bench_server.measure(
                pai_client,
                system=SYSTEM,
                n_calls=n_calls,
                start=lambda: start(n_calls),
                tool_activity=is_tool_activity,
                timeout=timeout,
            )
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    result["output_bytes"] = output_bytes
    return result


def main(argv: list[str] | None = None) -> int:
    """CLI: run each N in ``--calls`` and print a markdown table."""
    return bench_server.cli(argv, SYSTEM, run_pydantic_ai, [20, 100])


if __name__ == "__main__":
    # Re-import under the package name so the workflow's module is not ``__main__`` in the sandbox.
    from benchmarks.peer_pydantic_ai import main as _entry

    sys.exit(_entry())
