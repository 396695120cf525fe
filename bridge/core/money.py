"""Dollar amounts as a room reads them (a run's spending cap, a day's budget)."""

from __future__ import annotations

import math


def usd(amount: float) -> str:
    """Cents, or two significant digits for an amount under a cent (never ``1e-06``,
    nor ``$0.00`` for a run that spent something)."""
    if amount == 0 or abs(amount) >= 0.01 or not math.isfinite(amount):
        return f"${amount:.2f}"
    digits = min(12, 1 - math.floor(math.log10(abs(amount))))
    return f"${amount:.{digits}f}"
