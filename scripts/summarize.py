"""Add up JUnit XML files into one closing line; fail in CI if anything was skipped."""

import os
import sys
import xml.etree.ElementTree as ET

totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()  # noqa: S314
    for suite in root.iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"total: {passed} passed, {failed} failed, {totals['skipped']} skipped")
if os.environ.get("CI") and totals["skipped"]:
    print("CI: skipped tests are failures here (a peer or dependency is missing)")
    sys.exit(1)
sys.exit(1 if failed or totals["tests"] == 0 else 0)
