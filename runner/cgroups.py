"""Whether runs can have cgroup v2 groups of their own here: checked once at start-up.

The supervisor creates each run's group (``runner/supervisor.py``); this
probe tells the operator up front what to expect, by doing the same once
with a throwaway group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from runner.proctree import cgroup_parent, enable_controllers


@dataclass(frozen=True)
class CgroupSupport:
    """``parent`` is where runs' groups go; ``problem`` says why groups or limits won't work."""

    parent: str
    groups: bool
    """Runs get a group of their own, stopped with ``cgroup.kill``."""
    limits: bool
    """``memory_max`` / ``pids_max`` can be applied."""
    problem: str = ""


def probe(root: str, *, limits: bool) -> CgroupSupport:
    """Try to create (and remove) a group under ``root`` (``auto``: our own group).

    With ``limits`` also check that the memory and pids controllers can be
    enabled for it. ``root`` ``off`` disables groups.
    """
    if root == "off":
        return CgroupSupport("", groups=False, limits=False, problem="[runner] cgroup_root is off")
    try:
        parent = cgroup_parent(root)
        test = os.path.join(parent, f"chatbridge-probe-{os.getpid()}")
        os.mkdir(test)
        try:
            if not os.path.exists(os.path.join(test, "cgroup.kill")):
                return CgroupSupport(
                    parent, groups=False, limits=False, problem="no cgroup.kill (Linux < 5.14)"
                )
        finally:
            os.rmdir(test)
    except OSError as exc:
        return CgroupSupport(
            "", groups=False, limits=False, problem=f"cannot create a group: {exc}"
        )
    if not limits:
        return CgroupSupport(parent, groups=True, limits=False)
    try:
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            available = set(f.read().split())
        missing = {"memory", "pids"} - available
        if missing:
            return CgroupSupport(
                parent,
                groups=True,
                limits=False,
                problem=f"controller(s) {', '.join(sorted(missing))} not available in {parent}",
            )
        enable_controllers(parent, ("memory", "pids"))
    except OSError as exc:
        return CgroupSupport(parent, groups=True, limits=False, problem=str(exc))
    return CgroupSupport(parent, groups=True, limits=True)
