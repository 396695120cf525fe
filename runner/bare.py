"""Starting one of the runner's own programs (the supervisor) in a bare interpreter:
``python -I -S``, the standard library only, so that no room setting (``PYTHONPATH``...)
changes what runs, and so that it starts fast (a run waits for it).

The program is run by its path as a module of a bare ``runner`` package, not as a
script: a script is compiled at every start (about 6 ms for the supervisor, more than
all its imports), a module's compiled form is cached beside it (the bridge's own
import keeps it fresh). The package stands there without its ``__init__`` (which
imports asyncio and the bridge's core): only the program and the standard-library
modules it imports load. Each program has ``main(args) -> int`` (``args`` without
the program's name).
"""

from __future__ import annotations

import sys

BOOTSTRAP = (
    "import sys; d, _, f = sys.argv[1].rpartition('/'); r = type(sys)('runner'); "
    "r.__path__ = [d]; sys.modules['runner'] = r; "
    "sys.exit(__import__('runner.' + f[:-3], fromlist=['main']).main(sys.argv[2:]))"
)


def bare_argv(program: str, *args: str) -> list[str]:
    """The command line that runs ``program`` (a ``runner/*.py`` path) with ``args``."""
    return [sys.executable, "-I", "-S", "-c", BOOTSTRAP, program, *args]


__all__ = ["BOOTSTRAP", "bare_argv"]
