"""What keeps the console safe: who may reach it, and which requests may change anything.

- Off loopback every request carries the access token (``MAKA_CONSOLE_TOKEN`` or one printed at
  start): ``?token=`` once sets an HttpOnly, SameSite=Strict cookie; ``Authorization: Bearer``
  works too. Without it: 401 ``console_token_required``.
- Every state-changing request is a POST whose form carries the CSRF token (the HMAC of the
  server's secret, rendered into each form): else 403 ``csrf_invalid``. GETs change nothing.
- On loopback no token is asked, and a request must name a loopback Host (``127.0.0.1``,
  ``localhost``, ``[::1]``): else 403 ``console_host_refused`` (a rebinding site's name is refused).
- ``--read-only``: every POST is refused, 403 ``console_read_only``, and no page shows a button.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

__all__ = ["COOKIE", "Guard", "Refused", "is_loopback"]

COOKIE = "maka_console_token"


class Refused(Exception):
    """A request the guard refuses: an HTTP status and a stable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def is_loopback(host: str) -> bool:
    """``host`` (an address or ``localhost``) reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(host: str) -> str:
    """A Host header's name, without its port (``[::1]:8580`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass(frozen=True)
class Guard:
    """``token``: the access token (None on loopback: no token asked); ``read_only``: refuse every action."""

    token: str | None = None
    read_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def csrf(self) -> str:
        return hmac.new(self.secret, b"maka-console-csrf", hashlib.sha256).hexdigest()

    def admit(
        self, *, query_token: str | None, cookie: str | None, bearer: str | None, host: str = "localhost"
    ) -> bool:
        """Whether the request may be served (True: and a query token should become the cookie).

        Raises:
            Refused: 401 ``console_token_required``; 403 ``console_host_refused``.
        """
        if self.token is None:
            # No token on loopback, so only a loopback name may be asked for: a page of another
            # site whose name was made to resolve to 127.0.0.1 (DNS rebinding) is refused.
            if not is_loopback(_hostname(host)):
                raise Refused(403, "console_host_refused", "this console answers only to a loopback Host")
            return False
        for given in (cookie, bearer, query_token):
            if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
                return given is query_token and given != cookie
        raise Refused(401, "console_token_required", "this console needs its access token (?token=...)")

    def check_action(self, csrf: str | None) -> None:
        """A POST may change state.

        Raises:
            Refused: 403 ``console_read_only``, 403 ``csrf_invalid``.
        """
        if self.read_only:
            raise Refused(403, "console_read_only", "this console is read-only (--read-only)")
        if csrf is None or not hmac.compare_digest(csrf.encode(), self.csrf.encode()):
            raise Refused(403, "csrf_invalid", "the form's CSRF token is missing or wrong; reload the page")
