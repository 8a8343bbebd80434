"""The console scripts' entry (torchfleet_cli/entry.py): without the [cli]
extra's modules the command says what to install; other import errors are not
dressed up as a missing extra. tests/images/test_client_install.py checks the
same with a real install without the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Runs the entry with ``module`` unimportable (None in sys.modules makes an
# import of it raise ModuleNotFoundError, as a missing install does).
RUN_WITHOUT = (
    "import sys; sys.modules[{module!r}] = None; "
    "from torchfleet_cli.entry import main; sys.argv = ['torchfleet', '--help']; main()"
)


def _run_without(module: str) -> subprocess.CompletedProcess[str]:
    code = RUN_WITHOUT.format(module=module)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("module", ["click", "rich", "kubernetes"])
def test_a_missing_extra_says_what_to_install(module: str) -> None:
    out = _run_without(module)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == (
        f"torchfleet: the command needs {module}, which its extra installs: "
        "pip install 'torchfleet[cli]'"
    )


def test_another_missing_module_is_shown_as_it_is() -> None:
    out = _run_without("torchfleet_cli.progress")
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "torchfleet_cli.progress" in out.stderr


def test_with_its_extra_the_command_runs() -> None:
    out = _run_without("not_a_module_anything_imports")
    assert out.returncode == 0, out.stderr
    assert "run" in out.stdout and "attach" in out.stdout
