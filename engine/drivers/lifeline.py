"""A child process that dies with its parent: rank processes must not outlive a killed controller."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(expected_parent: int, sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies; exit now if it already has.

    Returns False where the platform has no such request (the process then relies on its parent's
    clean shutdown). `expected_parent` closes the race of a parent dying before the request.
    """
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True
