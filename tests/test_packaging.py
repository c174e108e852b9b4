"""The distribution installs from a clean venv, both as a wheel and editable.

This guards pyproject's package-dir mapping (four top-level folders installed under
one import name), which is easy to break and invisible in a developer's own venv, and
the optional C extension: where a compiler exists, both installs must build it.

Each install runs from a copy of the sources: an editable install builds the extension
in place, and rewriting the .so that this test run (and its broker processes) have
mapped could crash them.

The wheel goes into a venv with its dependencies, as a user's ``pip install`` does, so
a module that imports something the base dependencies lack fails there. The editable
install adds only rillet (``--no-deps``) and finds the dependencies in this test run's
own site-packages through a .pth file: it guards the package-dir mapping in place, and
installing every dependency a second time cost 10-15 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every module of every sub-package imports from the installed copy: a sub-package missing
# from pyproject's list would be absent from the wheel and fail here.
IMPORTS = (
    "import importlib, pkgutil, rillet.client; from rillet.storage import batchwrite; "
    "[importlib.import_module(m.name) for c in ('client', 'storage', 'controller', 'broker', "
    "'tools') for m in pkgutil.walk_packages(importlib.import_module('rillet.' + c).__path__, "
    "'rillet.' + c + '.') if not m.name.startswith('rillet.client.spark')"
    " and not m.name.endswith('__main__')]; "
    "print(rillet.client.__file__); print(batchwrite.NATIVE)"
)
SOURCES = (
    "client",
    "storage",
    "controller",
    "broker",
    "tools",
    "pyproject.toml",
    "setup.py",
    "README.md",
)


def _copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _have_compiler() -> bool:
    return shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is not None


def _install(tmp_path: Path, *pip_args: str, deps: bool = True) -> Path:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    if not deps:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # A plain path line: this run's site-packages go on sys.path after the venv's
        # own, without their .pth files (so not this checkout's editable rillet).
        (Path(site) / "rillet-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        pip_args = ("--no-deps", *pip_args)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args],
        check=True,
        cwd=tmp_path,
    )
    return python


def _import_from_elsewhere(python: Path, cwd: Path) -> tuple[str, str]:
    # Run outside the source tree so the imports come from the installed distribution.
    out = subprocess.run(
        [str(python), "-c", IMPORTS], check=True, cwd=cwd, capture_output=True, text=True
    )
    location, native = out.stdout.split()
    return location, native


@pytest.mark.timeout(600)
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_clean_venv_install_imports_every_component(tmp_path: Path, editable: bool) -> None:
    src = _copy_sources(tmp_path / "src")
    args = ["-e", str(src)] if editable else [str(src)]
    python = _install(tmp_path, *args, deps=not editable)
    location, native = _import_from_elsewhere(python, tmp_path)
    if editable:
        assert Path(location) == src / "client" / "__init__.py"
    else:
        assert "site-packages" in Path(location).parts
    if _have_compiler():
        assert native == "True", "the C extension was not built"
    rillet = python.parent / "rillet"
    help_out = subprocess.run(
        [str(rillet), "--help"], check=True, cwd=tmp_path, capture_output=True, text=True
    ).stdout
    assert "rillet" in help_out


def test_running_python_is_supported() -> None:
    assert sys.version_info >= (3, 11)


# Dependencies no module imports, and why they stay: tools run by name or by config.
USED_WITHOUT_IMPORT = {
    "pytest-asyncio": "asyncio_mode in pyproject",
    "pytest-timeout": "timeout in pyproject",
    "ruff": "make lint / make format",
    "python-snappy": "kafka-python's snappy codec (tests/test_kafka_oracle.py)",
    "python-multipart": "Starlette's request.form() (the console's action forms)",
    "httpx2": "Starlette's TestClient (tests/test_console_review.py)",
    "check-jsonschema": "run as a module by tests/test_compose.py (the compose-spec schema)",
    "podman-compose": "run by name in tests/test_compose_podman.py (make compose-test)",
    "flask": "moto's S3 server app (tools/local_s3.py), the s3 extra",
    "flask-cors": "moto's S3 server app (tools/local_s3.py), the s3 extra",
}
IMPORT_NAMES = {
    "prometheus-client": "prometheus_client",
    "pyyaml": "yaml",
    "kafka-python": "kafka",
    "nats-py": "nats",
}


def test_every_declared_dependency_is_used() -> None:
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += extra
    sources = "\n".join(
        p.read_text()
        for folder in ("client", "storage", "controller", "broker", "tools", "tests", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
    )
    unused = []
    for requirement in declared:
        name = re.split(r"[<>=\[ ]", requirement, maxsplit=1)[0]
        if name in USED_WITHOUT_IMPORT:
            continue
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from) {module}\b", sources, re.MULTILINE):
            unused.append(name)
    assert not unused, f"declared but never imported: {unused}"
