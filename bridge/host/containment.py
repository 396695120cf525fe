"""What contains a run on this host, said once at start-up.

Every run is contained by its supervisor (a child subreaper); cgroup v2
groups, and with them ``memory_max`` / ``pids_max``, depend on the host.
Limits that are configured but cannot be applied are an error in the log,
not a silent no-op; runs still start, contained by the supervisor.
"""

from __future__ import annotations

import logging

from bridge.config import Settings
from runner.cgroups import CgroupSupport, probe

log = logging.getLogger(__name__)


def rooms_with_limits(settings: Settings) -> list[str]:
    """Rooms (and ``[defaults]``) that set ``memory_max`` or ``pids_max``."""
    named = [
        str(key)
        for key, room in settings.room_settings.items()
        if room.memory_max is not None or room.pids_max is not None
    ]
    defaults = settings.defaults
    if defaults.memory_max is not None or defaults.pids_max is not None:
        named.insert(0, "[defaults]")
    return named


def report_containment(settings: Settings) -> CgroupSupport:
    """Probe cgroup support once and log what runs will get."""
    limited = rooms_with_limits(settings)
    support = probe(settings.runner.cgroup_root, limits=bool(limited))
    if support.groups:
        log.info("each run gets a cgroup of its own under %s", support.parent)
    else:
        log.info("runs are contained by their supervisor only (no cgroup: %s)", support.problem)
    if limited and not support.limits:
        log.error(
            "memory_max / pids_max are set for %s but cannot be applied on this host (%s); "
            "those runs start without them",
            ", ".join(limited),
            support.problem,
        )
    return support
