"""Keeping a user's Ctrl-C from being swallowed by the harness's own error handlers.

The harness turns a backend's exceptions into result rows, and a failed CUDA graph capture into a fall
back to the events timer, with ``except Exception``, which a KeyboardInterrupt passes through. But a
Ctrl-C that lands inside a capture can come back as the capture's own error (torch's graph context ends
the broken capture on the way out, and that can raise), with the KeyboardInterrupt only as its context.
Caught there, the run would go on as if nothing had happened. That would explain a GPU run stopped by a
single SIGINT (``timeout -s INT``) that was later killed with run.json still "running" (not reproduced).
"""

from __future__ import annotations


def reraise_interrupt(exc: BaseException) -> None:
    """Raise KeyboardInterrupt if ``exc`` was raised while one was being handled (its cause or context
    chain holds one); otherwise return, for the caller's handler to deal with ``exc``."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        seen.add(id(e))
        e = e.__cause__ or e.__context__
