"""The distribution installs from a clean venv, both as a wheel and editable.

This guards pyproject's package-dir mapping (four top-level folders installed under
one import name), which is easy to break and invisible in a developer's own venv.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = (
    "import rillet.client, rillet.client.records, rillet.storage, rillet.controller, "
    "rillet.broker; print(rillet.client.__file__)"
)


def _install(tmp_path: Path, *pip_args: str) -> Path:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args],
        check=True,
        cwd=tmp_path,
    )
    return python


def _import_from_elsewhere(python: Path, cwd: Path) -> str:
    # Run outside the source tree so the imports come from the installed distribution.
    out = subprocess.run(
        [str(python), "-c", IMPORTS], check=True, cwd=cwd, capture_output=True, text=True
    )
    return out.stdout.strip()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_clean_venv_install_imports_every_component(tmp_path: Path, editable: bool) -> None:
    args = ["-e", str(ROOT)] if editable else [str(ROOT)]
    python = _install(tmp_path, *args)
    location = Path(_import_from_elsewhere(python, tmp_path))
    if editable:
        assert location == ROOT / "client" / "__init__.py"
    else:
        assert "site-packages" in location.parts
    rillet = python.parent / "rillet"
    help_out = subprocess.run(
        [str(rillet), "--help"], check=True, cwd=tmp_path, capture_output=True, text=True
    ).stdout
    assert "rillet" in help_out


def test_running_python_is_supported() -> None:
    assert sys.version_info >= (3, 11)
