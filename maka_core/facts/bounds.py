"""The bounds on what a person or a program hands a session, declared once.

Every string and number an Update of the session workflow takes (``send_message``, ``approve``,
``deny``, ``cancel_turn``, ``wait_settled``), and the operator's inputs of ``maka session
resolve|raise-limit|approve|deny|cancel``, is checked against one of the declarations below:

- ``OPERATOR_NAME`` (who approves, denies, cancels, resolves): 1-200 characters, one printable line;
- ``OPERATOR_REASON`` (why): 1-2,000 characters, one printable line;
- ``IDENTIFIER`` (an approval id, a run id) and ``APPROVAL_PHRASE``: 1-200 characters, one line;
- ``USER_MESSAGE``: at most 256 KiB of UTF-8 (newlines and tabs are text), no NUL, no lone
  surrogate; a blank message keeps its own code (``empty_message``);
- ``WAIT_SECONDS`` (``wait_settled``'s ``timeout_s``): a finite number from 0.001 to 86,400.

"One printable line" is ``maka_core.facts.printable.UNSAFE``: no control character (newline, tab
and escape included), no surrogate, no line separator, no bidi control. A value out of bounds is
refused with the bound's code (``input_invalid``; ``message_invalid`` for a message) naming the
field, before anything is written.

The Update input models (``workflows/contracts.py``) carry these declarations on their fields as
metadata pydantic does not enforce when it decodes: a history's accepted Update must always decode
on replay, whatever bound a later release sets. The session's validators enforce them
(``check_fields``); Temporal does not run a validator again on replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from maka_core.errors import MakaError
from maka_core.facts.printable import line_problem

__all__ = [
    "APPROVAL_PHRASE",
    "IDENTIFIER",
    "INPUT_INVALID",
    "MESSAGE_INVALID",
    "OPERATOR_NAME",
    "OPERATOR_REASON",
    "USER_MESSAGE",
    "WAIT_SECONDS",
    "InputInvalid",
    "NumberBound",
    "TextBound",
    "Bound",
    "check",
    "check_fields",
]

INPUT_INVALID: Final = "input_invalid"
MESSAGE_INVALID: Final = "message_invalid"


class InputInvalid(MakaError):
    """An input outside its declared bound; ``field`` names it as it is sent."""

    default_code = INPUT_INVALID


@dataclass(frozen=True)
class TextBound:
    """A string's bound. ``one_line``: 1 to ``max_chars`` characters, one printable line;
    otherwise a text of lines: at most ``max_bytes`` of UTF-8, no NUL (nobody types one, and a
    consumer that reads C strings, a log, a terminal or a vendor's parser, cuts the text there),
    no lone surrogate (not UTF-8: no vendor takes it)."""

    max_chars: int = 200
    one_line: bool = True
    max_bytes: int | None = None
    code: str = INPUT_INVALID

    def problem(self, value: object) -> str | None:
        """Why ``value`` is out of this bound (``None`` when it is within)."""
        if not isinstance(value, str):
            return f"must be a string, not {type(value).__name__}"
        if not self.one_line:
            return self._text_problem(value)
        if not value.strip():
            return "must not be empty"
        if len(value) > self.max_chars:
            return f"is longer than {self.max_chars} characters"
        return line_problem(value)

    def _text_problem(self, value: str) -> str | None:
        if "\x00" in value:
            return "holds a NUL character"
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return "is not valid UTF-8 (it holds a lone surrogate)"
        if self.max_bytes is not None and size > self.max_bytes:
            return f"is {size} bytes of UTF-8, more than {self.max_bytes}"
        return None


@dataclass(frozen=True)
class NumberBound:
    """A number's bound: finite, from ``least`` to ``most`` (a bool is not a number here)."""

    least: float
    most: float
    code: str = INPUT_INVALID

    def problem(self, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {type(value).__name__}"
        if not math.isfinite(value):
            return f"must be a finite number, not {value}"
        if not self.least <= value <= self.most:
            return f"must be from {self.least:g} to {self.most:g}, not {value:g}"
        return None


Bound = TextBound | NumberBound

OPERATOR_NAME: Final = TextBound(max_chars=200)
OPERATOR_REASON: Final = TextBound(max_chars=2000)
IDENTIFIER: Final = TextBound(max_chars=200)
APPROVAL_PHRASE: Final = TextBound(max_chars=200)
USER_MESSAGE: Final = TextBound(one_line=False, max_bytes=256 * 1024, code=MESSAGE_INVALID)
#: A workflow timer's resolution is a millisecond; a longer wait is re-issued (the client's long
#: poll re-attaches every 10 s).
WAIT_SECONDS: Final = NumberBound(least=0.001, most=86_400.0)


def check(bound: Bound, value: Any, field: str) -> None:
    """Refuse ``value`` of ``field`` when it is out of ``bound``.

    Raises:
        InputInvalid: the bound's code, ``field`` in its detail.
    """
    why = bound.problem(value)
    if why is not None:
        raise InputInvalid(bound.code, f"{field} {why}", field=field)


def check_fields(model: BaseModel) -> None:
    """Check every field of ``model`` that declares a bound in its metadata (a ``None`` of an
    optional field is absent, so within); the field is named as it is sent (its alias).

    Raises:
        InputInvalid: the first field out of its bound.
    """
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        for bound in info.metadata:
            if isinstance(bound, TextBound | NumberBound) and value is not None:
                check(bound, value, info.alias or name)
