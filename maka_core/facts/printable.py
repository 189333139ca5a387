"""Text a person reads on a terminal: what makes a line lie, and how such text is shown (escaped).

A model, a vendor, an MCP server, a tool or an operator chooses many strings maka prints: tool
names, reasons, ids, messages. Printed raw, a newline in one forges a line of the output, a
carriage return overwrites it, an escape sequence drives the terminal, and a bidi override
(U+202E...) shows it in another order than it reads. Every text printer (the ``maka`` commands,
``maka audit``'s report, the worker's lifecycle lines) shows such strings through ``printable``
(one line) or ``printable_block`` (a text whose lines are meant: a transcript), so each printed
line is exactly one line, in the order it is stored. The stored value never changes: ``--json``
and the ledger keep it as it came.

A one-line value (a name, an id, a reason) is shown as Python's ``str.isprintable`` sees it: every
other character escaped, the invisible ones too (a zero-width space, the tag characters that hide
text in a name, a non-breaking space), so two names that print alike are alike. A transcript keeps
its text but for ``UNSAFE``: the lines are the model's and the user's own words.

``UNSAFE`` is also what ``maka_core.facts.bounds`` refuses in one-line inputs (an operator's
name or reason, an id): the characters are declared here, once.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["UNSAFE", "line_problem", "printable", "printable_block", "printable_json"]

#: Every character that moves, hides or reorders what a line shows: the C0 controls (newline, tab
#: and carriage return included), DEL and the C1 controls (Cc), the surrogates a non-UTF-8
#: argument decodes to (Cs), the line and paragraph separators (Zl, Zp), and Unicode's
#: Bidi_Control characters (U+061C, U+200E-U+200F, the overrides and embeddings U+202A-U+202E, the
#: isolates U+2066-U+2069).
_C0: Final = "\x00-\x1f"
_BEYOND_C0: Final = "\x7f-\x9f\ud800-\udfff\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
UNSAFE: Final = re.compile(f"[{_C0}{_BEYOND_C0}]")
#: The same set but the newline and the tab: what a multi-line text may not hold when shown.
_UNSAFE_IN_BLOCK: Final = re.compile(f"[\x00-\x08\x0b-\x1f{_BEYOND_C0}]")
#: What JSON text leaves raw of the set (a JSON string escapes every C0 control itself).
_UNSAFE_IN_JSON: Final = re.compile(f"[{_BEYOND_C0}]")

_NAMED: Final = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(ch: str) -> str:
    # ``\n``, ``\t``, ``\x1b``, ``\u202e``, ``\ud800``, ``\U000e0041``: ASCII, always safe to print.
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escaped(match: re.Match[str]) -> str:
    return _escape(match.group())


def printable(value: object) -> str:
    """``value`` as one line a terminal shows as it reads: every character ``str.isprintable``
    refuses but the space escaped (``\\n``, ``\\x1b``, ``\\u202e``, ``\\u200b``): all of
    ``UNSAFE``, and the invisible ones. Idempotent: a shown string shows the same again."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else _escape(ch) for ch in text)


def printable_block(text: str) -> str:
    """``text`` whose newlines and tabs are meant (a transcript): every other ``UNSAFE``
    character escaped, so no line is overwritten, reordered or driven."""
    return _UNSAFE_IN_BLOCK.sub(_escaped, text)


def printable_json(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with every ``UNSAFE`` character a string
    of it holds raw written as a ``\\uXXXX`` escape: the same JSON value, inert on a screen."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def line_problem(text: str) -> str | None:
    """Why ``text`` is not one printable line (``None`` when it is)."""
    found = UNSAFE.search(text)
    if found is None:
        return None
    return f"holds {printable(found.group())} at {found.start()}: must be one printable line"
