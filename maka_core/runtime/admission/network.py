"""Step 6, the network: the sandbox is built per call, from its recorded decision.

A tool with a network switch (``bash``) gets the network exactly when its decision says
``"network": true`` (``governed.bound_network``); a decision that grants it, made by a worker with
``--bash-network`` (before an approval, say), is refused on a worker without it
(``bash_network_unavailable``). It comes before the evidence, which is captured by the tool as it
will run.
"""

from __future__ import annotations

from typing import Any

from maka_core.runtime import governed
from maka_core.runtime.admission.verdicts import Refusal
from maka_core.runtime.contracts import CallRef, RunIds
from maka_core.tools import Tool, ToolRefusal


def networked(ids: RunIds, call: CallRef, tool: Tool, record: dict[str, Any]) -> Tool | Refusal:
    """``tool`` with the network its decision grants, or the refusal of a grant this worker lacks."""
    try:
        return governed.bound_network(tool, record)
    except ToolRefusal as exc:
        return Refusal(ids=ids, call=call, result=exc.to_result())


__all__ = ["networked"]
