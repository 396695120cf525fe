"""The ping benchmarks' common table: chatbridge against a bare echo bot on the same peer."""

from __future__ import annotations

import statistics


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[89], cuts[98]


def report(title: str, timings: dict[str, list[float]], coalesce_ms: int) -> None:
    """p50/p90/p99 of both bots, their ratio, and chatbridge's time above echo plus the window."""
    print(f"{title}, ms ({len(timings['echo'])} pings each, alternating)")
    print(f"{'':12} {'p50':>8} {'p90':>8} {'p99':>8}")
    rows = {name: percentiles(samples) for name, samples in timings.items()}
    for name, (p50, p90, p99) in rows.items():
        print(f"{name:12} {p50:8.1f} {p90:8.1f} {p99:8.1f}")
    echo50, bridge50 = rows["echo"][0], rows["chatbridge"][0]
    print(f"chatbridge / echo (p50): {bridge50 / echo50:.2f}x")
    print(
        f"chatbridge above echo + window ({coalesce_ms} ms), p50: "
        f"{bridge50 - echo50 - coalesce_ms:.1f} ms"
    )
