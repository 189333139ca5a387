"""A call's admission, computed once: guard, arguments, offer, preflight, policy decision and
approval, network, evidence, guarantee (``pipeline.admit``), into one verdict that T1 commits
(``runtime.tool_admission``): an ``Admission``, a ``Refusal``, ``AwaitingApproval``, or the
outcome of a call the ledger settled before. One module per step."""

from maka_core.runtime.admission.pipeline import Verdict, admit
from maka_core.runtime.admission.verdicts import Admission, AwaitingApproval, Refusal

__all__ = ["Admission", "AwaitingApproval", "Refusal", "Verdict", "admit"]
