"""maka-temporal: durable agent sessions on Temporal that never run a tool twice.

The installed distribution claims two top-level names, ``maka_temporal`` and ``maka_core``; the
repository's ``workflows``, ``activities`` and ``workers`` folders are installed under this package
(``maka_temporal.workflows`` ...) so a Temporal project with packages of those names keeps them.
"""

__all__: list[str] = []
