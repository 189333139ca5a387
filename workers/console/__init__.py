"""``maka console``'s web app: a local, read-mostly window on the ledger and Temporal, through
``SessionClient`` alone (no state of its own, no second authority). ``app`` builds the Starlette
application (pages, the live transcript over server-sent events, the operators' actions as POSTs);
``guard`` is what keeps it safe (the access token off loopback, the CSRF token, read-only);
``park_words`` says every park reason in plain words;
``templates/`` and ``static/`` are package data, served by the app (no CDN, no build step)."""

__all__ = ["app", "guard", "park_words"]
