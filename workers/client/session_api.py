"""``SessionClient``: the sessions of a maka deployment, from your own code (the CLI's commands
call it too).

Each method refuses what the matching ``maka`` command refuses, with the same codes and before
anything is started or written, by raising ``SessionError`` (one type; ``.code`` is the stable
refusal code, ``.detail`` its fields). Each answer is a frozen pydantic model.

The Temporal side (``session_client``, ``turn_messages``, ``connect``, ``audit``, and the host for
``resume``) is imported inside the functions that talk to Temporal, the only function-local imports
of the client room: the ledger-only calls (``show``, ``resolve``, ``raise_limit``, ``status``
without a server) and the CLI commands over them start without loading the Temporal SDK
(``tests/test_cli_startup.py``; 1.0 s against 1.8 s for ``maka session show`` measured).

The ledger a client names is the one its workers serve (default ``MAKA_DB``, else
``$MAKA_HOME/ledger.sqlite``): a start records the session's policy there before its workflow
exists, and status, show, approve, deny, resolve, resume and audit read or write it there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from maka_core.errors import MakaError
from maka_core.facts import codec
from maka_core.runtime.contracts import (
    DEFAULT_MAX_PARALLEL_TOOLS,
    DEFAULT_MAX_STEPS_PER_TURN,
    DEFAULT_STEP_TIMEOUT_S,
    NEW_SESSION_TOOL_MODE,
)
from maka_core.runtime.resolution import resolve_operation
from maka_core.runtime.session_view import transcript_lines
from maka_core.runtime.usage_limits import raise_limit
from maka_core.settings import MakaSettings, load_settings
from maka_core.tools.loader import load_tools, with_tools
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.answers import (
    ApprovalAnswer,
    AuditAll,
    AuditResult,
    Decision,
    FollowLine,
    LimitRaise,
    Resolution,
    Resumed,
    ResumeProgress,
    SessionError,
    Status,
    Transcript,
    TurnStarted,
    WaitProgress,
    refusing,
)
from maka_temporal.workers.client.approval_answers import answer
from maka_temporal.workers.client.ledger import open_ledger, session_events
from maka_temporal.workers.client.session_follow import follow_lines
from maka_temporal.workers.client.session_list import SessionSummary, list_query, list_sessions
from maka_temporal.workers.client.session_start import NewSession, SessionStart, check_message, new_session
from maka_temporal.workflows.contracts import TurnCancelled

__all__ = ["SessionClient"]

log = logging.getLogger(__name__)


class SessionClient:
    """Sessions over a connected Temporal client (``temporalio.client.Client`` with the pydantic
    data converter: ``maka_temporal.connect`` or a client given ``MakaPlugin``).

    ``ledger``: the workers' ledger (path or SQLAlchemy URL); ``task_queue``: the queue their
    workers poll (default ``MAKA_TASK_QUEUE`` or ``maka``); ``tools``: the tools they serve beside
    the built-ins, which ``resume`` checks a lost run's catalog against (a library fleet's
    ``MakaPlugin(tools=...)``; default ``MAKA_TOOLS``, as ``maka worker``). ``client`` may be ``None`` for the
    ledger-only calls (``show``, ``approve``, ``deny``, ``resolve``) and for ``status``, which then
    answers from the ledger.
    """

    def __init__(
        self,
        client: Any,
        *,
        ledger: str | Path | None = None,
        task_queue: str | None = None,
        tools: Sequence[Any] | None = None,
    ) -> None:
        self.client = client
        self._ledger = str(ledger) if ledger is not None else None
        self._task_queue = task_queue
        self._tools = tuple(tools) if tools is not None else None
        #: Why ``client`` is None, when ``connect`` could not reach the server (a code): ``status`` says so.
        self.unreachable: str | None = None
        self._connector: Callable[[], Awaitable[None]] | None = None  # a lazy ``connect``'s
        self.settings().ledger  # noqa: B018  a bad ledger or queue is refused here, not at first use

    @classmethod
    async def connect(
        cls,
        address: str | None = None,
        namespace: str | None = None,
        *,
        ledger: str | Path | None = None,
        task_queue: str | None = None,
        tools: Sequence[Any] | None = None,
        timeout: float | None = None,
        lazy: bool = False,
        ledger_only_when_unreachable: bool = False,
    ) -> SessionClient:
        """A client connected with maka's settings (``maka_temporal.connect``: ``TEMPORAL_*``,
        envconfig profiles, ``address``/``namespace`` win), within ``timeout`` seconds if given.

        ``lazy``: connect on the first call that talks to Temporal, after that call's own local
        refusals (a bad message, tools or ledger are refused as such with no server up; the CLI
        connects so). ``ledger_only_when_unreachable``: a server that does not answer gives a
        ledger-only client (``client`` None, ``unreachable`` the failed connect's code) instead
        of the refusal: ``status`` then answers from the ledger and says why (``maka session status``).

        Raises:
            SessionError: ``temporal_unavailable`` (and the connect's other codes), unless
                ``ledger_only_when_unreachable``; with ``lazy``, from the first call that connects.
        """
        made = cls(None, ledger=ledger, task_queue=task_queue, tools=tools)

        async def connector() -> None:
            from maka_temporal.workers.client.connect import connect as connect_temporal

            try:
                call = connect_temporal(address, namespace)
                made.client = await (call if timeout is None else asyncio.wait_for(call, timeout))
            except Exception as exc:
                why = exc.code if isinstance(exc, MakaError) else type(exc).__name__
                if not ledger_only_when_unreachable:
                    if isinstance(exc, MakaError):
                        raise SessionError.of(exc) from None
                    raise SessionError("temporal_unavailable", f"no Temporal server answers: {why}") from None
                made.unreachable = why

        if lazy:
            made._connector = connector
        else:
            await connector()
        return made

    def settings(self, **flags: Any) -> MakaSettings:
        """The settings this client runs with (the environment, its ledger and queue, ``flags``)."""
        try:
            return load_settings(db=self._ledger, task_queue=self._task_queue, **flags)
        except MakaError as exc:
            raise SessionError.of(exc) from None

    def check_local(self, *, tools: bool = False) -> list[Any]:
        """What ``resume`` (``tools``) and ``audit`` check before they reach Temporal: the settings,
        the tools (``tools_invalid``) and that the ledger opens (``ledger_not_found``,
        ``store_unreadable``, ``schema_too_new``); the tools loaded. The CLI calls it before it
        connects, so a command failing both ways names the local fault, as the call does."""
        s = self.settings()
        try:
            loaded = self._workers_tools(s) if tools else []
            with open_ledger(s.ledger, create=False):
                pass
        except MakaError as exc:
            raise SessionError.of(exc) from None
        return loaded

    def _workers_tools(self, s: MakaSettings) -> list[Any]:
        # The fleet's own tools, so the catalog gate sees what its workers serve: those given to
        # this client (a library fleet's ``MakaPlugin(tools=...)``), else ``MAKA_TOOLS`` (``maka worker``).

        if self._tools is not None:
            with_tools(default_tools(), self._tools)  # checked as MAKA_TOOLS is: tools_invalid
            return list(self._tools)
        return load_tools(s.tools, default_tools())

    async def _connected(self) -> Any:
        """The Temporal client, or None; a lazy ``connect`` connects here, once."""
        if self.client is None and self._connector is not None:
            connector, self._connector = self._connector, None
            await connector()
        return self.client

    async def _temporal(self) -> Any:
        if await self._connected() is None:
            why = f" ({self.unreachable})" if self.unreachable else ""
            raise SessionError("temporal_unavailable", f"this SessionClient has no Temporal client{why}")
        return self.client

    # --- turns -------------------------------------------------------------------------------

    async def start(
        self,
        *,
        workspace: str | Path,
        message: str,
        script: str | Path | None = None,
        model: str | None = None,
        policy: str | Path | None = None,
        session_id: str | None = None,
        host: str | None = None,
        system: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        step_timeout: float = DEFAULT_STEP_TIMEOUT_S,
        context_window: int | None = None,
        context_reserve: int | None = None,
        model_step_mode: str = "with_tool",
        max_steps: int = DEFAULT_MAX_STEPS_PER_TURN,
        continue_as_new_after: int | None = None,
        continue_as_new_after_steps: int | None = None,
        principal: str | None = None,
        on_behalf_of: tuple[str, ...] = (),
        unhinged: bool = False,
        accept_timeout: float | None = None,
        offer: Sequence[str] | None = None,
        tool_mode: str = NEW_SESSION_TOOL_MODE,
        max_parallel_tools: int = DEFAULT_MAX_PARALLEL_TOOLS,
        stream: bool | None = None,
    ) -> TurnStarted:
        """Start a session on ``workspace`` and send its first message (``maka session start``).

        Every input is checked first; then the session's policy is recorded in the ledger, the
        workspace marker written and the workflow started. ``host``: the workspace's host (default
        ``MAKA_HOST``, the machine's name); ``accept_timeout``: how long a worker has to accept the
        message (default ``MAKA_WAIT_TIMEOUT``); ``offer``: the tool set the model is offered
        (``builtins``, ``melra``, ``user``, ``mcp``, ``mcp:<server>``, tool names; default every
        tool), recorded in the session's config. The keywords are ``SessionStart``'s fields (the
        one declaration of a new session's settings), with ``host`` and ``accept_timeout``.
        """
        try:
            given = SessionStart.of(
                workspace=workspace,
                message=message,
                script=script,
                model=model,
                policy=policy,
                session_id=session_id,
                system=system,
                temperature=temperature,
                max_tokens=max_tokens,
                step_timeout=step_timeout,
                context_window=context_window,
                context_reserve=context_reserve,
                model_step_mode=model_step_mode,
                max_steps=max_steps,
                continue_as_new_after=continue_as_new_after,
                continue_as_new_after_steps=continue_as_new_after_steps,
                principal=principal,
                on_behalf_of=on_behalf_of,
                unhinged=unhinged,
                offer=offer,
                tool_mode=tool_mode,
                max_parallel_tools=max_parallel_tools,
                stream=stream,
            )
        except MakaError as exc:
            raise SessionError.of(exc) from None
        return await self.start_with(self.check_start(given, host=host), accept_timeout=accept_timeout)

    def check_start(self, given: SessionStart, *, host: str | None = None) -> NewSession:
        """Every refusal of a new session that needs no server (``start``'s), in the CLI's order,
        with the policy and script files read once: the session about to start, for ``start_with``.
        Nothing is written. ``host``: as in ``start``."""
        try:
            return new_session(self.settings(host=host), given)
        except MakaError as exc:
            raise SessionError.of(exc) from None

    async def start_with(self, new: NewSession, *, accept_timeout: float | None = None) -> TurnStarted:
        """Start the session ``check_start`` checked: its policy is recorded in the ledger, the
        workspace marker written, the workflow started and the first message sent."""
        from maka_temporal.workers.client.session_client import START_NEVER_HAPPENED, start_session

        s = self.settings(wait_timeout=accept_timeout)

        async def go() -> TurnStarted:
            client = await self._temporal()  # before anything is written: a refused connect leaves nothing
            with open_ledger(s.ledger, create=True) as store:
                recorded = new.record(store)
            config = new.config
            try:
                sid, accepted = await start_session(
                    client,
                    workspace=new.workspace,
                    provider=new.provider,
                    task_queue=s.task_queue,
                    message=new.message,
                    session_id=new.session_id,
                    accept_timeout=s.wait_timeout,
                    refusals=True,
                    config=config,
                )
            except MakaError as exc:
                # The server refused the start outright (no workflow exists, nothing read the
                # policy): leave no policy behind, so a corrected start may choose another. Any
                # other failure (``temporal_unavailable`` may hide a start that happened) keeps it.
                if recorded and exc.code in START_NEVER_HAPPENED:
                    new.policy.forget_in(s)
                raise
            return _started(sid, accepted)

        return await refusing(go())

    async def send(
        self, session_id: str, message: str, *, accept_timeout: float | None = None
    ) -> TurnStarted:
        """Send a message: one new turn (``maka session send``). A session whose execution closed
        after a clean turn gets a new execution built from its recorded config; one lost mid-turn
        is refused ``resume_required``."""
        from maka_temporal.workers.client.reopen import reopen
        from maka_temporal.workers.client.session_client import describe_execution, send_message

        s = self.settings(wait_timeout=accept_timeout)

        async def go() -> TurnStarted:
            text = check_message(message)
            client = await self._temporal()
            if not (await describe_execution(client, session_id)).open:
                await reopen(client, s, session_id)
            accepted = await send_message(
                client, session_id, text, accept_timeout=s.wait_timeout, refusals=True
            )
            return _started(session_id, accepted)

        return await refusing(go())

    async def wait(
        self,
        session_id: str,
        run_id: str | None = None,
        *,
        timeout: float | None = None,
        on_progress: Callable[[WaitProgress], None] | None = None,
    ) -> Status:
        """Wait until the turn ``run_id`` (default: the one running now) settles; its status.
        ``wait_timeout`` when it takes longer than ``timeout`` (default ``MAKA_WAIT_TIMEOUT``).
        ``on_progress`` hears the turn's state after each round of the long poll that did not
        settle it (about every 10 s, and at each continue-as-new)."""
        from maka_temporal.workers.client.session_client import query_status, wait_settled

        s = self.settings(wait_timeout=timeout)

        async def go() -> Status:
            client = await self._temporal()
            target = run_id
            if target is None:
                now = await query_status(client, session_id)
                turn = now.current_turn or now.last_turn
                if turn is None:
                    return await self.status(session_id)
                target = turn.run_id
            watched: str = target

            def heard(state: str, elapsed: float) -> None:
                if on_progress is not None:
                    on_progress(
                        WaitProgress(session_id=session_id, run_id=watched, state=state, elapsed_s=elapsed)
                    )

            await wait_settled(client, session_id, watched, timeout=s.wait_timeout, on_state=heard)
            return await self.status(session_id)

        return await refusing(go())

    async def cancel(
        self, session_id: str, *, reason: str | None = None, by: str | None = None
    ) -> TurnCancelled:
        """Cancel the running turn (``maka session cancel``, the ``cancel_turn`` Update): a model step
        is abandoned, a running tool cancelled (its T2 records ``tool_cancelled``), a call whose end
        nobody saw settled by its guarantee; the run ends ``cancelled`` and the session is idle.

        Raises:
            SessionError: ``turn_not_running``, ``turn_not_cancellable``, ``turn_not_cancelled``,
                ``session_not_found``, ``temporal_unavailable``.
        """
        from maka_temporal.workers.client import turn_messages

        async def go() -> TurnCancelled:
            return await turn_messages.cancel_turn(await self._temporal(), session_id, reason=reason, by=by)

        return await refusing(go())

    # --- reading -----------------------------------------------------------------------------

    async def status(self, session_id: str) -> Status:
        """State, turns and every tool call's facts (``maka session status``): the workflow's state
        while its execution is open, the ledger's otherwise (``notes`` says which)."""
        from maka_temporal.workers.client.status import session_status

        async def go() -> Status:
            client = await self._connected()
            return await session_status(client, self.settings(), session_id, unreachable=self.unreachable)

        return await refusing(go())

    async def list(
        self, *, state: str | None = None, host: str | None = None, since: Any = None, limit: Any = None
    ) -> tuple[SessionSummary, ...]:
        """The ledger's sessions, newest activity first, from its index (``maka session list``)."""
        ledger, ask = self.settings().ledger, (state, host, since, limit)
        return await refusing(asyncio.to_thread(lambda: list_sessions(ledger, list_query(*ask))))

    async def show(self, session_id: str) -> Transcript:
        """The transcript and events, from the ledger (``maka session show``)."""
        s = self.settings()

        def read() -> Transcript:
            events = session_events(s.ledger, session_id)
            return Transcript(
                session_id=session_id,
                lines=tuple(transcript_lines(events)),
                events=tuple(json.loads(codec.encode(e)) for e in events),
            )

        return await refusing(asyncio.to_thread(read))

    async def follow(
        self, session_id: str, run_id: str | None = None, *, as_json: bool = False
    ) -> AsyncIterator[FollowLine]:
        """The transcript as its facts commit, until the turn settles (``maka session show
        --follow``): one ``FollowLine`` per transcript line (``as_json``: per event, its canonical
        JSON). ``run_id``: follow that run (the one ``send`` returned), waiting for its header.
        Read from the ledger alone, so it follows a turn whatever process runs it.

        Raises:
            SessionError: ``session_not_found``, ``run_not_found``, the ledger's codes.
        """
        async for line in follow_lines(self.settings().ledger, session_id, run_id, as_json=as_json):
            yield line

    async def audit(self, session_id: str) -> AuditResult:
        """The ledger's lineage against every execution that hosted it (``maka audit``)."""
        return (await self._audit([session_id])).sessions[0]

    async def audit_all(self) -> AuditAll:
        """Every session of the ledger audited over one opened ledger, whose chain is verified once
        (``maka audit --all``)."""
        return await self._audit(None)

    async def _audit(self, session_ids: Sequence[str] | None) -> AuditAll:
        from maka_temporal.workers.client.audit import audit_session

        s = self.settings()

        async def go() -> AuditAll:
            with open_ledger(s.ledger, create=False) as store:  # its refusals before Temporal's
                client = await self._temporal()
                sessions = store.sessions() if session_ids is None else session_ids
                problems = store.verify() if session_ids is None else None
                results: list[AuditResult] = []
                for sid in sessions:
                    report = await audit_session(client, store, sid, verify_problems=problems)
                    results.append(AuditResult(session_id=sid, ok=report.ok, raw=report.to_json()))
            return AuditAll(ok=all(r.ok for r in results), sessions=tuple(results))

        return await refusing(go())

    # --- operators ---------------------------------------------------------------------------

    async def approve(
        self, session_id: str, approval_id: str, *, phrase: str, by: str | None = None
    ) -> ApprovalAnswer:
        """Approve a pending tool call with its challenge phrase (``maka session approve``): the
        ``approve`` Update while the session's execution runs (its turn wakes at once), else the
        ledger alone takes the answer. The decision is a ledger fact first either way."""
        return await refusing(self._answer(session_id, approval_id, allow=True, phrase=phrase, by=by))

    async def deny(
        self, session_id: str, approval_id: str, *, by: str | None = None, reason: str | None = None
    ) -> ApprovalAnswer:
        """Deny a pending tool call (``maka session deny``): the ``deny`` Update, or the ledger."""
        return await refusing(self._answer(session_id, approval_id, allow=False, by=by, reason=reason))

    async def _answer(
        self,
        session_id: str,
        approval_id: str,
        *,
        allow: bool,
        phrase: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> ApprovalAnswer:
        done = await answer(
            self.settings().ledger,
            self._connected,
            session_id,
            approval_id,
            allow=allow,
            phrase=phrase,
            by=by,
            reason=reason,
        )
        return ApprovalAnswer(
            session_id=session_id,
            approval_id=approval_id,
            decision=str(done["decision"]),
            operation_id=done.get("operationId"),
            raw=done,
        )

    async def resolve(
        self, session_id: str, operation_id: str, *, decision: Decision, by: str, reason: str
    ) -> Resolution:
        """Record an operator's resolution of a parked operation (``maka session resolve``), then
        wake the session's open execution (``raw["wake"]``: ``client.wake.WakeSent``): once every
        parked call of its turn is settled it goes on by itself. A closed execution (a child
        session's) goes on with ``resume``."""
        s = self.settings()

        def write() -> Resolution:
            with open_ledger(s.ledger, create=False) as store:
                done = resolve_operation(store, session_id, operation_id, decision, by, reason)
            return Resolution(session_id=session_id, operation_id=operation_id, decision=decision, raw=done)

        resolved = await refusing(asyncio.to_thread(write))
        # The Temporal side loads once the resolution is written (``show`` and its siblings never).
        from maka_temporal.workers.client.wake import send_wake

        try:  # the resolution stands whatever becomes of its wake-up (``maka resume`` sends it again)
            sent = await send_wake(await self._connected(), session_id, by=by)
            if sent == "no_client" and self.unreachable:
                sent = "temporal_unavailable"  # a server was asked for and did not answer
        except SessionError:
            sent = "temporal_unavailable"
        return resolved.model_copy(update={"raw": {**resolved.raw, "wake": sent}})

    async def raise_limit(
        self, session_id: str, *, caps: Mapping[str, int], by: str, reason: str
    ) -> LimitRaise:
        """Raise the session's spent token caps (``maka session raise-limit``; ``caps``:
        ``maxTokensPerSession`` / ``maxTokensPerTurn`` -> the new cap), recorded with who and why;
        then terminate the parked execution and ``resume`` (a parked turn takes no ``send``).
        Refusals: ``usage_limits.raise_limit``."""
        s = self.settings()

        def write() -> LimitRaise:
            with open_ledger(s.ledger, create=False) as store:
                done = raise_limit(store, session_id, caps=caps, raised_by=by, reason=reason)
            return LimitRaise(session_id=session_id, caps=dict(done["caps"]), raw=done)

        return await refusing(asyncio.to_thread(write))

    async def resume(
        self,
        session_id: str,
        *,
        wait: bool = False,
        restore: Literal["isolated"] | None = None,
        rebaseline: bool = False,
        on_progress: Callable[[ResumeProgress], None] | None = None,
        wait_timeout: float | None = None,
    ) -> Resumed:
        """Continue a session whose execution is lost, through the planner, or one parked with
        ``workspace_host_unavailable`` (``maka resume``); with ``wait``, until the turn settles. An
        open execution parked on a call is woken (``raw["woken"]``): it continues in place once
        every parked call is resolved, else stays parked (``raw["unsettledOperations"]``).

        ``restore="isolated"`` continues in a new folder restored from the checkpoint,
        ``rebaseline`` from the workspace's current files (a new epoch): the choice is committed
        before the resume plans. A lost run with a tool in flight is settled only once its old
        attempt cannot still be running (the attempt fence); ``on_progress`` hears the workspace
        choice and the fence's wait as they happen. ``wait_timeout`` bounds ``wait`` (default
        ``MAKA_WAIT_TIMEOUT``): past it ``wait_timeout`` is raised and the continued turn goes on.

        Raises:
            SessionError: ``config_invalid`` (both ``restore`` and ``rebaseline``), ``session_busy``,
                ``session_not_found``, ``resume_not_needed``, ``continuation_already_exists``, ...
        """
        # The one call that runs host work: the runtime and its tools load here, not for every client.
        from maka_temporal.workers.client.resume import resume_session

        s = self.settings(wait_timeout=wait_timeout)
        return await refusing(
            resume_session(
                session_id,
                settings=s,
                tools=lambda: self._workers_tools(s),
                temporal=self._temporal,
                task_queue=self._task_queue,
                wait=wait,
                wait_timeout=s.wait_timeout,
                restore=restore,
                rebaseline=rebaseline,
                on_progress=on_progress,
            )
        )


def _started(session_id: str, accepted: Any) -> TurnStarted:
    return TurnStarted(
        session_id=session_id,
        turn_id=accepted.turn_id,
        run_id=accepted.run_id,
        invocation_id=accepted.invocation_id,
    )
