"""Stage stamps: where one message's way through the bridge is, on one clock.

``stamp("accepted")`` logs ``stage accepted <time.monotonic()>`` at DEBUG on
the ``bridge.stages`` logger. ``time.monotonic`` is one clock for every
process of the host on Linux, so the stamps line up with the fake claude's
(``FAKE_CLAUDE_TIMES``) and with a benchmark's own: ``bench/bench_ping.py
--breakdown`` reads them from the service's log to say where a ping's time
goes. Off DEBUG a stamp costs one level check.
"""

from __future__ import annotations

import logging
import time

_log = logging.getLogger("bridge.stages")


def enabled() -> bool:
    """Whether stamps are logged (to skip work done only for a stamp)."""
    return _log.isEnabledFor(logging.DEBUG)


def stamp(stage: str) -> None:
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("stage %s %.6f", stage, time.monotonic())
