"""Per-segment provider replay (facts §5.5-§5.6) and the canonical forms the digests hash."""

from __future__ import annotations

from typing import Any

from maka_core.facts.events import Refs, TextContent, ThinkingContent
from maka_core.ledger.digests import read_prefix
from maka_core.ledger.provider_replay import STEERING_TEMPLATE, build_replay_plan, replay_segment
from tests import ledger_factory as f


def segment(events: list[Any]) -> Any:
    return replay_segment(read_prefix(f.wire(events)))


def items(events: list[Any]) -> list[dict[str, Any]]:
    replay = segment(events)
    assert replay.block is None, replay.block
    return list(replay.items)


def user_with(**content: Any) -> Any:
    return f.event("evt-u", role="user", author="user", content=TextContent(**content))


def test_steering_quotes_and_attachments_shape_the_user_item() -> None:
    attachment = {
        "kind": "image",
        "name": "a.png",
        "mimeType": "image/png",
        "bytes": 3,
        "ref": {"kind": "workspace_file", "relativePath": "a.png"},
    }
    event = user_with(
        text="look", steering=True, quotes=[{"text": "q", "label": 'say "hi"'}], attachments=[attachment]
    )
    (item,) = items([event])
    body = (
        "look\n\n<quoted_excerpt label=\"say 'hi'\">\nq\n</quoted_excerpt>\n[attachment: a.png (image/png)]"
    )
    assert item["content"] == STEERING_TEMPLATE.format(body)
    assert item["steering"] == {"eventId": "evt-u"} and item["attachments"] == [attachment]


def test_empty_user_text_is_unsupported_and_empty_model_text_is_skipped() -> None:
    assert segment([user_with(text="")]).block == "provider_replay_unsupported"
    assert [i["eventId"] for i in items([f.user(), f.text("")])] == ["evt-user-1"]


def test_tool_outputs_are_projected_for_the_model() -> None:
    terminal = {
        "kind": "terminal",
        "cwd": "/w",
        "cmd": "ls",
        "status": "completed",
        "exitCode": 0,
        "output": {},
    }
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-old\n+new\n same\n"
    created = "--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n"
    events = [
        f.user(),
        *f.t1("c1", "Bash"),
        f.response("c1", "Bash", terminal),
        *f.t1("c2", "Edit"),
        f.response("c2", "Edit", {"kind": "file_diff", "paths": ["x.py"], "diff": diff}),
        *f.t1("c3", "Write"),
        f.response("c3", "Write", {"kind": "file_diff", "paths": ["n.txt"], "diff": created}),
        *f.t1("c4", "Write"),
        f.response("c4", "Write", {"kind": "file_write", "bytes": 12, "path": "w.txt"}),
    ]
    outputs = [i["output"] for i in items(events) if i["kind"] == "tool_result"]
    assert outputs == [
        {k: v for k, v in terminal.items() if k != "cmd"},
        "Edited x.py (+1 -1)",
        "Created n.txt (+2)",
        "Wrote 12 bytes to w.txt",
    ]


def test_an_invalid_shell_result_blocks_the_segment() -> None:
    bad = {"kind": "terminal", "cwd": "/w", "cmd": "ls", "status": "completed", "exitCode": 1, "output": {}}
    events = [f.user(), *f.t1("c1", "Bash"), f.response("c1", "Bash", bad)]
    assert segment(events).block == "provider_replay_unsupported"


def test_signed_thinking_is_dropped_beside_an_unstepped_call() -> None:
    thinking = f.event(
        "evt-think", role="model", author="agent", content=ThinkingContent(text="hmm", signature="sig")
    )
    replayed = items([f.user(), thinking, *f.t1("c1", "Bash"), f.response("c1", "Bash", "ok")])
    assert "evt-think" not in [i["eventId"] for i in replayed]
    stepped = f.call("c1", operation_id="op-c1")
    stepped = stepped.model_copy(update={"refs": Refs(operation_id="op-c1", tool_call_id="c1", step_id="s1")})
    replayed = items([f.user(), thinking, stepped, f.dispatch("c1"), f.response("c1", "Bash", "ok")])
    assert [i["kind"] for i in replayed] == ["text", "thinking", "tool_call", "tool_result"]
    assert replayed[2]["stepId"] == "s1"


def test_unsettled_and_corrupt_tool_state_block_before_projection() -> None:
    assert segment([f.user(), *f.t1("c1")]).block == "tool_recovery_unsettled"
    hidden = [f.user(), *f.t1("c1", model_visibility="hidden")]
    assert segment(hidden).block == "tool_recovery_unsettled"
    assert segment([f.user(), f.response("c9", bound=False)]).block == "tool_recovery_corruption"


def test_text_provider_options_are_dropped_and_automation_origin_is_hashed_as_released() -> None:
    origin = {"kind": "automation", "automationId": "a-1"}
    plain = read_prefix(f.wire([user_with(text="hi", origin=origin)]))
    assert plain.canonical[0]["content"]["origin"]["kind"] == "legacy_automation"
    legacy = read_prefix(f.wire([user_with(text="hi", origin={**origin, "kind": "legacy_automation"})]))
    assert legacy.digest == plain.digest
    with_options = read_prefix(f.wire([user_with(text="hi", origin=origin, provider_options={"x": 1})]))
    assert "providerOptions" not in with_options.canonical[0]["content"]
    assert with_options.digest == plain.digest
    other = read_prefix(f.wire([user_with(text="hi!", origin=origin)]))
    assert other.digest != plain.digest


def test_high_water_cuts_the_prefix_and_changes_its_digest() -> None:
    events = f.wire([f.user(), f.text("a"), f.terminal()])
    whole, cut = read_prefix(events), read_prefix(events, 2)
    assert (whole.last_event_seq, cut.last_event_seq) == (3, 2)
    assert whole.digest != cut.digest
    assert build_replay_plan([cut]).boundary["segments"][0]["position"]["lastEventId"] == "evt-model-1"
