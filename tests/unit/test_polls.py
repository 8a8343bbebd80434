"""Every test waits through the shared helpers of tests/fixtures/poll.py.

A hand-written poll (a ``while`` loop that sleeps and checks a deadline of its
own) is a second, slightly different answer to "wait until": its timeout
message names nothing, it forgets the last value seen, it sleeps before the
first check or not at all. So this test fails on one anywhere under tests/,
naming the file and line. A loop that reads a stream until a deadline (a
terminal, a queue) is not a poll: it blocks on the stream, not on a sleep.
Code that runs inside pods (tests/e2e/scripts, tests/e2e/hold) has no fixtures
to import and is not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
HOME = TESTS / "fixtures/poll.py"
IN_PODS = (TESTS / "e2e/scripts", TESTS / "e2e/hold")
SLEEPS = {"sleep"}  # time.sleep, asyncio.sleep
CLOCKS = {"monotonic", "time", "perf_counter"}


def _calls(node: ast.AST, names: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in names:
                return True
    return False


def hand_written_polls(source: str) -> Iterator[int]:
    """The line of each while loop that both sleeps and reads a clock."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.While) and _calls(node, SLEEPS) and _calls(node, CLOCKS):
            yield node.lineno


def _checked() -> list[Path]:
    return [
        path
        for path in sorted(TESTS.rglob("*.py"))
        if path != HOME and not any(path.is_relative_to(folder) for folder in IN_PODS)
    ]


@pytest.mark.parametrize("path", _checked(), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_hand_written_poll(path: Path) -> None:
    lines = list(hand_written_polls(path.read_text()))
    assert not lines, f"{path.relative_to(TESTS)}:{lines}: wait through tests/fixtures/poll.py"


def test_the_check_finds_a_poll_and_passes_a_stream_read() -> None:
    # The check above passes vacuously if it found nothing it should.
    assert list(hand_written_polls(HOME.read_text()))  # the helpers' own loops
    poll = "while time.monotonic() < deadline:\n    if ready():\n        break\n    time.sleep(1)\n"
    assert list(hand_written_polls(poll)) == [1]
    stream = "while time.monotonic() < deadline:\n    line = queue.get(timeout=1)\n"
    assert list(hand_written_polls(stream)) == []
