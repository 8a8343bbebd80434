"""Test tiers share fixtures from tests/fixtures/: every module there is a
pytest plugin, so each tier's fixtures live in a file of their own."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)
