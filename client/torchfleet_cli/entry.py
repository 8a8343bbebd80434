"""The console scripts' entry point (``torchfleet``, ``kubectl-torchfleet``),
importable without the command's dependencies.

``pip install torchfleet`` without the ``[cli]`` extra installs the scripts
but not click, rich or the Kubernetes client; a script then said nothing but
a traceback ending in ``ModuleNotFoundError: No module named 'click'`` (or,
for the Kubernetes client, which the command imports only when it first talks
to the API server, after it had started). Now it says what to install before
it starts, and exits 1.
"""

from __future__ import annotations

import importlib.util
import sys

# What the [cli] extra brings (pyproject.toml), by import name.
CLI_EXTRA_MODULES = ("click", "kubernetes", "rich")


def missing_extra() -> str | None:
    """The first of the extra's modules this interpreter cannot import."""
    for name in CLI_EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except ValueError:  # None in sys.modules: an import of it fails
            found = None
        if found is None:
            return name
    return None


def main() -> None:
    missing = missing_extra()
    if missing is not None:
        sys.exit(
            f"torchfleet: the command needs {missing}, which its extra installs: "
            "pip install 'torchfleet[cli]'"
        )
    from torchfleet_cli.cli import main as command

    command()
