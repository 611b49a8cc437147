"""Keeping a user's Ctrl-C from being swallowed by the harness's own error handlers, and a SIGTERM
handled as one.

The harness turns a backend's exceptions into result rows, and a failed CUDA graph capture into a fall
back to the events timer, with ``except Exception``, which a KeyboardInterrupt passes through. But a
Ctrl-C that lands inside a capture can come back as the capture's own error (torch's graph context ends
the broken capture on the way out, and that can raise), with the KeyboardInterrupt only as its context.
Caught there, the run would go on as if nothing had happened, run.json still "running".

SIGTERM is what ``timeout``, CI runners and job schedulers send; its default action ends the process on the
spot, run.json still "running". ``sigterm_as_interrupt``
makes a run stop on it as on Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (then the handler before it is back). Python runs
    signal handlers in the main thread only, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


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
