"""How an ``AsyncLease`` is kept renewed: its renew loop runs as an asyncio task, pauses with
``asyncio.sleep`` and is stopped by cancelling the task.

Written by hand: the one part of the asyncio client that ``tools/gen_sync.py`` does not
carry over, since a thread (``_renew_sync.py``) stops and waits differently. Both modules
offer the same names: ``Event``, ``sleep`` and ``Renewer``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, Callable, ContextManager, Optional

Event = asyncio.Event
"""What ``lease.lost`` is."""

sleep = asyncio.sleep
"""A pause that lets the event loop run."""


class Renewer:
    """Runs a lease's renew loop in a task of the running event loop."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._task: Optional["asyncio.Task[None]"] = None
        self._stopped = False
        # The lease's state changes on the event loop's one thread: nothing to lock.
        self.lock: ContextManager[Any] = contextlib.nullcontext()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def start(self, loop: Callable[[], Awaitable[None]]) -> None:
        self._task = asyncio.ensure_future(loop())

    async def wait(self, seconds: float) -> bool:
        """Pause; ``True`` when the renewer was stopped meanwhile (the loop then ends)."""
        await asyncio.sleep(seconds)
        return self._stopped

    async def stop(self) -> None:
        """Stop the loop and wait until it has ended (it may be inside a renew: cancelled)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
