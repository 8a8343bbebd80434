"""Lists the failed and erroring tests of pytest JUnit XML reports, one line each.

``dev/test-tiers.sh`` prints this last, where a log cut down to its start and
end still shows why each test failed: the first line of its message, which
pytest's short summary cuts at the terminal's width. Missing reports (a
session that never started) are skipped.

    python dev/failures.py REPORT.xml...
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

WIDTH = 400


def failures(report: Path) -> Iterator[str]:
    for case in ET.parse(report).getroot().iter("testcase"):
        for outcome in ("failure", "error"):
            found = case.find(outcome)
            if found is None:
                continue
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            message = (found.get("message") or found.text or "").strip().splitlines()
            yield f"{outcome.upper()} {test}: {message[0] if message else ''}"[:WIDTH]


def main(paths: list[str]) -> int:
    lines = [line for path in map(Path, paths) if path.is_file() for line in failures(path)]
    if lines:
        print("\nfailures (the first line of each):")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
