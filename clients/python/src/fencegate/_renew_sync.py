"""How a blocking ``Lease`` is kept renewed: its renew loop runs in a daemon thread, pauses on
a ``threading.Event`` and is stopped by setting it (then joined).

Written by hand: the counterpart of ``_renew_async.py`` (the same names: ``Event``, ``sleep``,
``Renewer``), the one part of the blocking client that is not generated from the asyncio one.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

Event = threading.Event
"""What ``lease.lost`` is."""

sleep = time.sleep


class Renewer:
    """Runs a lease's renew loop in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # The renew thread and the caller's may both mark the lease lost.
        self.lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self, loop: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=loop, name=f"fencegate-lease-{self._name}",
                                        daemon=True)
        self._thread.start()

    def wait(self, seconds: float) -> bool:
        """Pause; ``True`` as soon as the renewer is stopped (the loop then ends)."""
        return self._stop.wait(seconds)

    def stop(self) -> None:
        """Stop the loop and wait until it has ended (unless called from the loop itself)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
