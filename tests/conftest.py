"""Test tiers share fixtures from tests/fixtures/: every module there is a
pytest plugin, so each tier's fixtures live in a file of their own."""

from pathlib import Path

import pytest

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``after_every_other_test`` go last, in their own order."""
    last = [item for item in items if item.get_closest_marker("after_every_other_test")]
    if last:
        items[:] = [item for item in items if item not in last] + last
