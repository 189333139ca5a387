"""A user's tool module with a sub-agent (issue 31 item 3), for ``maka worker --tools``: the
sub-agent ``scribe`` (its script: ``MAKA_TEST_SCRIBE_SCRIPT``) and the at-most-once
``append_entry`` its child session calls (``effects``: one line in ``journal.log`` per run)."""

from __future__ import annotations

import os

from maka_core.tools.subagent import SubAgent
from tests.user_tools_pkg.effects import append_entry

scribe = SubAgent(
    "scribe", "Writes one journal entry", script=os.environ.get("MAKA_TEST_SCRIBE_SCRIPT", "scribe.json")
)

__all__ = ["append_entry", "scribe"]
