"""How long something took, for people: ``0.8s``, ``12s``, ``2m05s``, ``1h02m``.

One formatter for progress messages and ``!status``. Under ten seconds it
shows tenths, so a stop after 0.8 s does not read "after 0s"; above that
whole seconds, then minutes and hours. Always rounded down: a ticking
"Working… 59s" never shows a minute that has not passed.
"""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    # The epsilon keeps binary fractions (2.3 * 10 == 22.999...) on their tenth.
    tenths = int(max(0.0, seconds) * 10 + 1e-6)
    if tenths < 100:
        whole, tenth = divmod(tenths, 10)
        return f"{whole}.{tenth}s" if tenth else f"{whole}s"
    minutes, secs = divmod(tenths // 10, 60)
    if minutes < 1:
        return f"{secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 1:
        return f"{minutes}m{secs:02d}s"
    return f"{hours}h{minutes:02d}m"
