"""A node process's life: a one-line fatal error instead of a traceback, and a stop flag set by signals.

SIGTERM or SIGINT (``systemctl stop``, ``timeout``, a container runtime, Ctrl-C, or the kernel's
parent-death signal when the local network that started the node dies) sets the stop flag: long waits
return at once and the node stops after its current step.  A step still running ``STOP_GRACE_SECONDS``
later is cut short — safe, because a node's saved state is written atomically after every window, so a
node stopped anywhere restarts from its last finished window.  A second signal stops it at once.
"""
from __future__ import annotations

import _thread
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

log = logging.getLogger("dso")
STOP_GRACE_SECONDS = 5.0
_RETURNED = threading.Event()  # main() has returned: the interpreter is exiting, nothing left to cut short


class Fatal(SystemExit):
    """Stop the process with one clear line (exit code 1)."""

    def __init__(self, message: str):
        super().__init__(1)
        self.message = message


def run_main(main: Callable[[], int]) -> None:
    """Run a node's main(); Fatal prints its one line instead of a traceback."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        code = main()
        _RETURNED.set()
        sys.exit(code)
    except Fatal as e:
        print(f"{Path(sys.argv[0]).stem}: {e.message}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # a stop signal cut a step short: the saved state is the last finished window's
        log.info("stopped during a step; the saved state is that of the last finished window")
        sys.exit(0)


class StopFlag:
    """Set by SIGINT/SIGTERM; long waits poll it so the process stops within a fraction of a second, and a
    step still running ``grace`` seconds after the signal is interrupted (KeyboardInterrupt in the main thread)."""

    def __init__(self, install_handlers: bool = True, grace: float = STOP_GRACE_SECONDS) -> None:
        self._event = threading.Event()
        self.grace = grace
        if install_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set():  # second signal (or the grace time is over): stop now
            raise KeyboardInterrupt
        log.info("signal %s: finishing the current step (at most %.0f s), then stopping",
                 signal.Signals(signum).name, self.grace)
        self._event.set()
        timer = threading.Timer(self.grace, self._cut_short)
        timer.daemon = True
        timer.start()

    def _cut_short(self) -> None:
        if _RETURNED.is_set():
            return
        log.warning("still busy %.0f s after the stop signal: interrupting the current step", self.grace)
        _thread.interrupt_main(signal.SIGINT)  # runs _handle in the main thread, which raises KeyboardInterrupt

    def set(self) -> None:
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when the full time passed."""
        return not self._event.wait(max(0.0, seconds))
