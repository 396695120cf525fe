"""The import-linter contracts in pyproject.toml fail when a layer is crossed.

``scripts/check.sh`` shows the real tree keeps them; here a copy of the tree
gets one bad import each and ``lint-imports`` must name the broken contract.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ["bridge", "dispatcher", "runner", "transports", "migrations"]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

LEAF = "bridge.core is the leaf"
INDEPENDENT = "are independent of each other"
ONLY_CORE = "take nothing from bridge but"
LAYERS = "bridge's groups follow the path of a message"
WEB_ON_TOP = "the web console is on top"


def copy_tree(dest: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_copied_tree_keeps_every_contract(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    result = lint_imports(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        ("bridge/core/aio.py", "import bridge.store.base", LEAF),
        ("bridge/core/model.py", "import bridge.config", LEAF),
        ("runner/request.py", "import transports.console", INDEPENDENT),
        ("bridge/outbound/notices.py", "import bridge.runs.executor", LAYERS),
        ("bridge/host/logs.py", "import bridge.inbound.intake", LAYERS),
        ("bridge/live/tool_view.py", "import bridge.cluster.role", LAYERS),
        ("bridge/runs/prompt.py", "import bridge.web.reads", WEB_ON_TOP),
        ("bridge/store/rules.py", "import dispatcher", INDEPENDENT),
        ("transports/text.py", "import bridge.config", ONLY_CORE),
        ("dispatcher/slots.py", "import bridge.metrics", ONLY_CORE),
        ("bridge/store/base.py", "import bridge.errors", ONLY_CORE),
        ("runner/events.py", "import migrations", ONLY_CORE),
    ],
)
def test_a_bad_import_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, contract: str
) -> None:
    copy_tree(tmp_path)
    with (tmp_path / module).open("a") as source:
        source.write(f"\n{bad_import}  # crosses a layer\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
