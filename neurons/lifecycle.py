"""A node process's life: a one-line fatal error instead of a traceback, and a stop flag set by signals."""
from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Callable

log = logging.getLogger("dso")


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
        sys.exit(main())
    except Fatal as e:
        print(f"{Path(sys.argv[0]).stem}: {e.message}", file=sys.stderr)
        sys.exit(1)


class StopFlag:
    """Set by SIGINT/SIGTERM; long waits poll it so the process stops within a fraction of a second."""

    def __init__(self, install_handlers: bool = True) -> None:
        self._event = threading.Event()
        if install_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set():  # second signal: stop now
            raise KeyboardInterrupt
        log.info("signal %s: finishing the current step, then stopping", signal.Signals(signum).name)
        self._event.set()

    def set(self) -> None:
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when the full time passed."""
        return not self._event.wait(max(0.0, seconds))
