"""Pacing: how long a vendor asked us to wait before the next attempt, read from its headers.

The delay becomes the retry's ``next_retry_delay`` (``activities.to_application_error``): Temporal
still owns the retry (its policy's attempt bound holds), but the next attempt starts when the
vendor said it would be welcome instead of on the policy's backoff schedule.

Headers, first found wins: ``retry-after-ms`` (OpenAI), ``retry-after`` (seconds or an HTTP date;
both vendors), then the vendors' rate-limit reset headers: Anthropic's
``anthropic-ratelimit-*-reset`` (RFC 3339 instants) and OpenAI's ``x-ratelimit-reset-*``
(durations such as ``1s``, ``6m0s``, ``250ms``), on a 429 only. Of several reset headers the
latest counts: the limit that was hit is one of them, and waiting for the latest never retries
into the same 429.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Final

#: A vendor cannot hold a model step longer than this per attempt (a bogus or hostile header must
#: not stall a turn for hours); past it the policy's own schedule applies again.
MAX_RETRY_DELAY_S: Final = 300.0

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _number(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and value >= 0 else None  # not NaN, not negative


def _duration(raw: str) -> float | None:
    """``6m0s``, ``1.5s``, ``250ms`` (OpenAI's reset headers) in seconds."""
    text = raw.strip()
    if not text or _DURATION.sub("", text):
        return _number(text)
    return sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(text))


def _instant(raw: str) -> float | None:
    """An RFC 3339 instant (Anthropic) or an HTTP date, as epoch seconds."""
    text = raw.strip()
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def retry_delay_s(
    headers: Mapping[str, str], *, rate_limited: bool, now: float | None = None
) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` when the headers do not say.

    ``rate_limited``: the response was a 429, so the rate-limit reset headers (sent on every
    response, by both vendors) say when the limit that refused us lifts; on another status they
    describe limits that were not hit, and only ``retry-after`` counts.

    ``headers`` is case-insensitive in practice (httpx); keys are looked up in lower case.
    ``now`` (epoch seconds) defaults to the response's ``date`` header, then the local clock, so an
    absolute reset instant is read against the vendor's clock when it sent one.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    if now is None:
        sent = _instant(lower["date"]) if "date" in lower else None
        now = sent if sent is not None else time.time()
    delay: float | None = None
    if "retry-after-ms" in lower and (ms := _number(lower["retry-after-ms"])) is not None:
        delay = ms / 1000.0
    elif "retry-after" in lower:
        raw = lower["retry-after"]
        delay = _number(raw)
        if delay is None and (at := _instant(raw)) is not None:
            delay = max(0.0, at - now)
    if delay is None and rate_limited:
        resets: list[float] = []
        for key, raw in lower.items():
            if key.startswith("anthropic-ratelimit-") and key.endswith("-reset"):
                at = _instant(raw)
                if at is not None:
                    resets.append(max(0.0, at - now))
            elif key.startswith("x-ratelimit-reset-"):
                seconds = _duration(raw)
                if seconds is not None:
                    resets.append(seconds)
        delay = max(resets) if resets else None
    if delay is None:
        return None
    return min(delay, MAX_RETRY_DELAY_S)
