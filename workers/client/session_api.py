"""``SessionClient``: the sessions of a maka deployment, from your own code (the CLI's commands
call it too).

Each method refuses what the matching ``maka`` command refuses, with the same codes and before
anything is started or written, by raising ``SessionError`` (one type; ``.code`` is the stable
refusal code, ``.detail`` its fields). Each answer is a frozen pydantic model.

The Temporal side (``session_client``, ``turn_messages``, ``connect``, ``audit``, and the host for
``resume``) is imported inside the methods that talk to Temporal, the only function-local imports
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
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from maka_core.errors import MakaError
from maka_core.facts import codec
from maka_core.runtime import workspace_continuity
from maka_core.runtime.continuation import read_session, runs_missing
from maka_core.runtime.contracts import (
    DEFAULT_MAX_STEPS_PER_TURN,
    DEFAULT_STEP_TIMEOUT_S,
    NEW_SESSION_TOOL_MODE,
)
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.resolution import resolve_operation
from maka_core.runtime.session_view import session_view, transcript_lines
from maka_core.runtime.usage_limits import raise_limit
from maka_core.settings import MakaSettings, load_settings
from maka_core.store.engine import database_url, sqlite_file
from maka_core.store.health import probe_path, probe_url
from maka_core.tools.loader import load_tools, with_tools
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.answers import (
    ApprovalAnswer,
    AuditAll,
    AuditResult,
    Decision,
    FollowKind,
    FollowLine,
    LimitRaise,
    Operation,
    ProgressKind,
    Resolution,
    Resumed,
    ResumeProgress,
    SessionError,
    Status,
    Transcript,
    TurnInfo,
    TurnStarted,
    WaitProgress,
    refusing,
)
from maka_temporal.workers.client.ledger import open_ledger, session_events
from maka_temporal.workers.client.policy import answer_approval, check_session_known, governance_status
from maka_temporal.workers.client.session_follow import follow as follow_ledger
from maka_temporal.workers.client.session_start import NewSession, SessionStart, check_message, new_session
from maka_temporal.workflows.contracts import TurnCancelled, workflow_id_for

__all__ = ["SessionClient", "reopen", "session_status"]

log = logging.getLogger(__name__)
#: How long an abandoned ``follow`` waits for its reader thread to end (one ledger read).
FOLLOW_JOIN_S = 5.0


class _FollowStopped(Exception):
    """The reader of ``follow`` went away: its ledger thread ends."""


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
            raise SessionError(
                "temporal_unavailable", f"this SessionClient has no Temporal client{why}"
            )
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
        async def go() -> Status:
            client = await self._connected()
            return await session_status(client, self.settings(), session_id, unreachable=self.unreachable)

        return await refusing(go())

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
        s = self.settings()
        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[FollowLine | BaseException | None] = asyncio.Queue()
        stop = threading.Event()
        kind: FollowKind = "event" if as_json else "transcript"

        def put(item: FollowLine | BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(lines.put_nowait, item)
            except RuntimeError:
                stop.set()  # the loop is gone: nobody reads any more

        def write(text: str) -> None:
            if stop.is_set():
                raise _FollowStopped
            put(FollowLine(session_id=session_id, kind=kind, text=text))

        def read() -> None:
            # The ledger is polled with blocking reads: on one thread of its own, which owns the
            # opened store from first read to last.
            try:
                follow_ledger(
                    s.ledger, session_id, as_json=as_json, write=write, run_id=run_id, stop=stop
                )
            except _FollowStopped:
                return
            except BaseException as exc:
                put(exc)
                return
            put(None)

        reader = threading.Thread(target=read, name=f"maka-follow-{session_id}", daemon=True)
        reader.start()
        try:
            while (item := await lines.get()) is not None:
                if isinstance(item, MakaError):
                    raise SessionError.of(item) from None
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # A caller that stops reading (break, cancel) ends the poll and closes the ledger now;
            # the reader wakes from its wait at once, or after the one read it is in.
            stop.set()
            await asyncio.to_thread(reader.join, FOLLOW_JOIN_S)  # off the loop: it may be mid-read

    async def audit(self, session_id: str) -> AuditResult:
        """The ledger's lineage against every execution that hosted it (``maka audit``)."""
        return (await self._audit([session_id])).sessions[0]

    async def audit_all(self) -> AuditAll:
        """Every session of the ledger audited over one opened ledger, whose chain is verified once
        (``maka audit --all``)."""
        return await self._audit(None)

    async def _audit(self, session_ids: list[str] | None) -> AuditAll:
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
        from maka_temporal.workers.client import turn_messages

        ledger = self.settings().ledger
        await asyncio.to_thread(check_session_known, ledger, session_id)  # before any connect
        sent = None
        client = await self._connected()
        if client is not None:
            try:
                sent = await turn_messages.answer_if_running(
                    client, session_id, approval_id, allow=allow, phrase=phrase, by=by, reason=reason
                )
            except MakaError as exc:
                if exc.code != "temporal_unavailable":
                    raise  # the server is down: the ledger alone takes the answer, below
        if sent is not None:
            done: dict[str, Any] = {
                "ok": True,
                "sessionId": session_id,
                "approvalId": approval_id,
                "operationId": sent.operation_id,
                "requestId": approval_id,
                "decision": sent.decision,
                "toolName": sent.tool_name,
                **({"reviewer": by} if by else {}),
                **({"rationale": reason} if reason else {}),
            }
        else:
            done = await asyncio.to_thread(
                lambda: answer_approval(
                    ledger, session_id, approval_id, allow=allow, phrase=phrase, by=by, reason=reason
                )
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
        """Record an operator's resolution of a parked operation (``maka session resolve``); then
        ``resume``."""
        s = self.settings()

        def write() -> Resolution:
            with open_ledger(s.ledger, create=False) as store:
                done = resolve_operation(store, session_id, operation_id, decision, by, reason)
            return Resolution(session_id=session_id, operation_id=operation_id, decision=decision, raw=done)

        return await refusing(asyncio.to_thread(write))

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
    ) -> Resumed:
        """Continue a session whose execution is lost, through the planner, or one parked with
        ``workspace_host_unavailable`` (``maka resume``); with ``wait``, until the turn settles.

        ``restore="isolated"`` continues in a new folder restored from the checkpoint,
        ``rebaseline`` from the workspace's current files (a new epoch): the choice is committed
        before the resume plans. A lost run with a tool in flight is settled only once its old
        attempt cannot still be running (the attempt fence); ``on_progress`` hears the workspace
        choice and the fence's wait as they happen.

        Raises:
            SessionError: ``config_invalid`` (both ``restore`` and ``rebaseline``), ``session_busy``,
                ``session_not_found``, ``resume_not_needed``, ``continuation_already_exists``, ...
        """
        # The one call that runs host work: the runtime and its tools load here, not for every client
        # (the only function-local imports of the client room; the CLI's are at its command boundary).
        from maka_temporal.workers.host.attempt_fence import AttemptFence
        from maka_temporal.workers.host.resume import choose_workspace, resume_lost_session, wait_continued
        from maka_temporal.workers.host.worker import default_runtime

        s = self.settings()

        def say(kind: ProgressKind, message: str) -> None:
            if on_progress is None:
                return
            try:
                on_progress(ResumeProgress(session_id=session_id, kind=kind, message=message))
            except Exception:
                # A caller's broken callback must not abort a resume half-way (after its workspace
                # choice committed, say): it hears nothing more from this step.
                log.exception("resume %s: on_progress raised; the resume goes on", session_id)

        async def go() -> Resumed:
            # The local refusals first (the tools, then the ledger, opened once), then Temporal's.
            tools = self._workers_tools(s)
            store = open_ledger(s.ledger, create=False)
            try:
                client = await self._temporal()
            except BaseException:
                store.close()
                raise
            rt = default_runtime(store, s.runtime_settings(), tools=tools)
            fence = AttemptFence(
                client, rt.settings.tool_heartbeat_timeout_s, say=lambda m: say("attempt_fence", m)
            )
            try:
                chosen = await choose_workspace(client, rt, session_id, restore, rebaseline)
                if chosen is not None:
                    say("workspace", workspace_continuity.describe(chosen))
                out = await resume_lost_session(
                    client,
                    rt,
                    session_id,
                    task_queue=self._task_queue,
                    feature_enabled=s.runtime_safe_boundary_resume is not False,
                    fence=fence,
                )
                if chosen is not None:
                    out["workspaceTransition"] = chosen
                if fence.waited:
                    out["attemptFenceS"] = round(fence.waited, 1)
                if wait and out["decision"] == "continue":
                    out = await wait_continued(client, rt, out, on_state=lambda state, _s: say("turn", state))
            finally:
                rt.close()
                store.close()
            return Resumed(
                session_id=session_id,
                decision=str(out["decision"]),
                state=out.get("state"),
                park_reason=out.get("parkReason"),
                raw=out,
            )

        return await refusing(go())


def _started(session_id: str, accepted: Any) -> TurnStarted:
    return TurnStarted(
        session_id=session_id,
        turn_id=accepted.turn_id,
        run_id=accepted.run_id,
        invocation_id=accepted.invocation_id,
    )


async def reopen(client: Any, s: MakaSettings, session_id: str) -> None:
    """A new execution for a session whose execution is gone, only when its last run ended cleanly.

    A run that a repair closed (its execution was lost mid-turn), a parked run, an unresolved
    operation or a claimed continuation that never ran all need ``maka resume`` (the planner).

    Raises:
        MakaError: ``session_not_found``, ``resume_required``, ``session_busy``.
    """
    from maka_temporal.workers.client.session_client import start_execution

    try:
        store = open_ledger(s.ledger, create=False)
    except MakaError as exc:
        if exc.code != "ledger_not_found":
            raise
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id) from None
    with store:
        session = read_session(store, session_id)
        view = session_view(store, session_id, workflow_id=workflow_id_for(session_id))
    latest = session.latest
    if latest is None:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    events = session.events.get(latest.run_id, [])
    terminal = next((e for e in reversed(events) if e.is_terminal), None)
    delta = terminal.actions.state_delta if terminal is not None and terminal.actions is not None else None
    recovered = isinstance(delta, dict) and bool(delta.get("recovered"))
    pending_claim = any(
        not any(e.is_terminal for e in session.events.get(c.target_run_id, [])) for c in session.claims
    )
    if view.state not in ("idle", "failed") or terminal is None or recovered or pending_claim:
        raise MakaError(
            "resume_required",
            f"session {session_id} lost its execution before its last run settled; "
            f"run `maka resume {session_id}`",
            sessionId=session_id,
            state=view.state,
        )
    record = session.record
    if record is None:
        raise MakaError(
            "resume_required", "the ledger holds no session record to restart from", sessionId=session_id
        )
    await start_execution(
        client,
        session_id,
        workspace=record.workspace,
        workspace_identity=record.workspace_identity,
        config=record.config,  # the session's settings, as recorded at its start
        task_queue=record.task_queue or s.task_queue,
    )


async def session_status(
    client: Any, s: MakaSettings, session_id: str, *, unreachable: str | None = None
) -> Status:
    """``SessionClient.status`` (and ``maka session status``): see there. ``unreachable``: why the
    caller has no client (the code of its failed connect), for the note."""
    from maka_temporal.workers.client.session_client import describe_execution, query_status

    status = None
    execution = None
    # Notes wait until the session is known to exist: an unknown session or a missing ledger is
    # one refusal, not a note about state "from the ledger" followed by it.
    notes: list[str] = []
    try:
        if client is None:
            raise MakaError(unreachable or "temporal_unavailable", "no Temporal client")
        execution = await asyncio.wait_for(describe_execution(client, session_id), 5)
        if execution.open:
            status = await asyncio.wait_for(query_status(client, session_id), 5)
        else:
            # A closed execution's Query replays its last in-memory state ("running" for one
            # terminated mid-turn): only the ledger knows what became of it.
            notes.append(f"maka: execution {execution.status or 'not found'}; state from the ledger")
    except Exception as exc:  # unreachable server or gone workflow: the ledger still answers
        why = exc.code if isinstance(exc, MakaError) else type(exc).__name__
        notes.append(f"maka: workflow not reachable ({why}); state from the ledger")
    if execution is not None and execution.task_failing:
        notes.append(
            f"maka: the workflow task of session {session_id} keeps failing "
            f"(attempt {execution.task_attempt}; an incompatible deploy?): terminate the execution, "
            f"then `maka resume {session_id}`"
        )

    def view_of(db: Any) -> Any:
        with open_ledger(db, create=False) as store:
            return session_view(
                store,
                session_id,
                workflow_id=workflow_id_for(session_id),
                state=status.state if status is not None else None,
                park_reason=status.park_reason if status is not None else None,
            )

    try:
        view = view_of(s.ledger)
    except MakaError as exc:
        if exc.code != "ledger_not_found" or status is None:
            raise
        view = view_of("sqlite://")  # the workflow alone answers
    if status is None and view.event_count == 0 and not view.turns:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    resume_refusal = None
    if status is None and not view.turns:
        # Events without run headers (an imported ledger): resume refuses, and says so here too.
        refusal = runs_missing(session_id, view.event_count)
        resume_refusal = refusal.to_json()
        notes.append(f"maka: {refusal.code}: {refusal.message}")
    health = _ledger_health(s.ledger)
    governed: dict[str, Any] = {"pendingApprovals": []}
    config = None
    try:
        with open_ledger(s.ledger, create=False) as store:
            governed = governance_status(store, session_id, view.state)
            record = session_record(store.events(session_id=session_id))
            config = record.config if record is not None else None
    except MakaError:
        pass
    host_wait = config.host_wait_s if config is not None else None
    host = (config.host if config is not None else None) or (status.host if status is not None else None)
    if execution is not None and not execution.open and view.state == "running":
        notes.append(
            f"maka: session {session_id} lost its execution before its run settled; a worker's "
            f"startup repair or `maka resume {session_id}` settles it from the ledger"
        )
    out = {
        **view.to_json(),
        **(execution.to_json() if execution else {}),
        "host": host,
        "hostWait": host_wait,
        "config": config.status_json() if config is not None else None,
        "ledger": health,
        **governed,
        **({"resume": resume_refusal} if resume_refusal else {}),
    }
    return Status(
        session_id=session_id,
        state=str(governed.get("state") or view.state),
        park_reason=view.park_reason,
        turns=tuple(
            TurnInfo(turn_id=t.turn_id, run_id=t.run_id, status=t.status, park_reason=t.park_reason)
            for t in view.turns
        ),
        operations=tuple(
            Operation(
                operation_id=o.operation_id,
                tool_call_id=o.tool_call_id,
                tool_name=o.tool_name,
                run_id=o.run_id,
                status=o.status,
                reason=o.reason,
                is_error=o.is_error,
            )
            for o in view.operations
        ),
        pending_approvals=tuple(governed["pendingApprovals"]),
        config=out["config"],
        host=host,
        execution_status=execution.status if execution is not None and execution.exists else None,
        notes=tuple(notes),
        raw=out,
    )


def _ledger_health(db: Any) -> dict[str, Any]:
    """Whether the ledger can take the next write (read-only, full), without writing to it."""
    url = database_url(db)
    file = sqlite_file(url)
    if file is not None:
        return probe_path(file)
    return probe_url(url) if url.startswith("postgresql") else {"ok": True}
