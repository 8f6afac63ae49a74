"""What SIGINT / SIGTERM do during a fit: the first is remembered so the callback that owns the
latch stops at the next step boundary; a second SIGINT stops at once. ``Preempted`` carries the
exit code a scheduler understands (128 + signal: 130, 143)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """The run stopped on a signal; exit code 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(128 + int(signum))
        self.signum = int(signum)


class SignalLatch:
    """Installs SIGINT / SIGTERM handlers for a fit (``install`` / ``restore``); ``received`` is
    the first signal, or None. ``then`` says what the owner does at the step boundary (logged)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, then: str):
        self.then = then
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            # asked twice: stop now. Not KeyboardInterrupt: Lightning turns that into exit 1,
            # and a scheduler must see 130.
            raise Preempted(signal.SIGINT)
        self.received = signum
        log.warning(
            "%s received: finishing this step, then %s (Ctrl-C again: stop now)",
            signal.Signals(signum).name,
            self.then,
        )

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only; Lightning's handlers stay in charge
        for sig in self.SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
