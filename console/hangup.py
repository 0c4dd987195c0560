"""End the console when its terminal goes away.

A closed terminal does not always reach the console as SIGHUP (it may not be in the terminal's
foreground process group, e.g. under `make`), and then Textual's writer blocks on the dead terminal
and its input thread spins: a console nobody can see holding a core. A small daemon thread, outside
the possibly blocked event loop, notices that the controlling terminal is gone and ends the process
the way a hang-up would.
"""

from __future__ import annotations

import errno
import os
import signal
import threading

GONE = (errno.ENXIO, errno.EIO)


def _terminal_present() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno in GONE:
            return False
        raise
    os.close(fd)
    return True


def watch_for_hangup(interval_s: float = 1.0) -> threading.Thread | None:
    """Start the watch if this process has a controlling terminal now; returns the thread (or None)."""
    try:
        if not _terminal_present():
            return None
    except OSError:
        return None

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(interval_s):
            if not _terminal_present():
                # SIGHUP's default action ends the process, as a hang-up would; nothing here handles it.
                os.kill(os.getpid(), signal.SIGHUP)
                return

    thread = threading.Thread(target=watch, name="console-hangup-watch", daemon=True)
    thread.start()
    return thread
