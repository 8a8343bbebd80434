"""dev/failures.py: make test's last lines name every failed test and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAILING = """
import pytest

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "the first line of why, longer than pytest's eighty columns keep of it\\nmore"

@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")

def test_errors(broken):
    pass
"""


def test_each_failure_and_error_is_listed_with_its_first_line(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(FAILING)
    report = tmp_path / "report.xml"
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts="]
    ran = subprocess.run(
        [*pytest, str(tmp_path / "test_sample.py"), f"--junitxml={report}", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 1, ran.stdout
    listed = (
        subprocess.run(
            [
                sys.executable,
                str(REPO / "dev" / "failures.py"),
                str(report),
                str(tmp_path / "none"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()
    )

    assert listed[0] == "failures (the first line of each):"
    assert sorted(listed[1:]) == [
        'ERROR test_sample::test_errors: failed on setup with "RuntimeError: the fixture broke"',
        "FAILURE test_sample::test_fails: AssertionError: the first line of why, longer "
        "than pytest's eighty columns keep of it",
    ]


def test_nothing_is_printed_when_every_test_passed(tmp_path: Path) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    report = tmp_path / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            str(tmp_path / "test_ok.py"),
            f"--junitxml={report}",
            "-q",
        ],
        cwd=tmp_path,
        capture_output=True,
        check=True,
    )
    listed = subprocess.run(
        [sys.executable, str(REPO / "dev" / "failures.py"), str(report)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout == ""
