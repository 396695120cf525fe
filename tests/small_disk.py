"""A small tmpfs, really filled and freed: the state directory's disk full (root only).

Mounted where the test process sees it (the runner resolves its state_dir,
so another namespace's ``/proc/PID/root`` would not do) and unmounted after
the test; run the tests under ``unshare -m`` to keep it out of the host's
mount table.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

needs_mount = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root: mounts a small tmpfs"
)

TMPFS_SIZE = "256k"


class SmallDisk:
    """A tmpfs of :data:`TMPFS_SIZE` that can be filled and freed. (A full tmpfs still
    takes what fits in a file's last page: what must not fit is over a page.)"""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def fill(self) -> None:
        """Write until the disk refuses: then nothing more fits."""
        chunk = b"\0" * 4096
        with open(self.filler, "wb", buffering=0) as out:
            refused = _write_until_refused(out, chunk)
        assert refused.errno == errno.ENOSPC

    def free(self) -> None:
        self.filler.unlink()


def _write_until_refused(out: BinaryIO, chunk: bytes) -> OSError:
    while True:
        try:
            out.write(chunk)
        except OSError as exc:
            return exc


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    options = f"size={TMPFS_SIZE},mode=0700"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", mountpoint], check=True)
    try:
        yield SmallDisk(mountpoint)
    finally:
        subprocess.run(["umount", "--lazy", mountpoint], check=True)
