"""Stage stamps: logged on the host's monotonic clock at DEBUG, nothing otherwise."""

from __future__ import annotations

import logging
import re
import time

import pytest

from bridge.core import stages


def test_a_stamp_is_the_monotonic_time_of_its_stage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="bridge.stages")
    before = time.monotonic()
    stages.stamp("accepted")
    after = time.monotonic()
    [record] = caplog.records
    match = re.fullmatch(r"stage accepted (\d+\.\d+)", record.getMessage())
    assert match is not None
    # Printed to the microsecond: within a microsecond of the calls around it.
    assert before - 1e-6 <= float(match[1]) <= after + 1e-6


def test_no_stamp_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bridge.stages")
    assert not stages.enabled()
    stages.stamp("accepted")
    assert not caplog.records
