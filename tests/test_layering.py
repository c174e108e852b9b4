"""Dependencies point one way, as in Kafka's module split (docs/architecture.md).

client/ imports nothing else of rillet; storage/ only client/; controller/ never broker/
or tools/; broker/ never tools/. Every import statement of every module is read, including
ones inside functions, so a lazy import cannot hide an arrow pointing the wrong way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ALLOWED = {
    "client": {"client"},
    "storage": {"client", "storage"},
    "controller": {"client", "storage", "controller"},
    "broker": {"client", "storage", "controller", "broker"},
    "tools": {"client", "storage", "controller", "broker", "tools"},
}


def rillet_imports(path: Path) -> list[tuple[int, str]]:
    """(line, component) for every `rillet.<component>` a module imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "rillet":
                names = [f"rillet.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "rillet" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


@pytest.mark.parametrize("component", sorted(ALLOWED))
def test_component_imports_point_one_way(component: str) -> None:
    modules = sorted((ROOT / component).rglob("*.py"))
    assert modules, f"no modules under {component}/"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports rillet.{target}"
        for path in modules
        for line, target in rillet_imports(path)
        if target not in ALLOWED[component]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_relative_imports_across_components() -> None:
    # Relative imports would let a module reach a sibling component without naming it.
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for component in ALLOWED
        for path in (ROOT / component).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert not relative, relative


def test_checker_sees_a_wrong_arrow(tmp_path: Path) -> None:
    # The checker itself must catch both import forms, including one inside a function.
    module = tmp_path / "m.py"
    module.write_text(
        "from rillet.client import errors\n"
        "def f():\n"
        "    import rillet.broker.server\n"
        "    from rillet import controller\n"
    )
    assert rillet_imports(module) == [(1, "client"), (3, "broker"), (4, "controller")]


def test_architecture_doc_names_every_module() -> None:
    # docs/architecture.md's module map is the reader's index to the code: a module it
    # does not name is one a reader cannot find from there.
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Module map") : doc.index("## The produce path")]
    unnamed = [
        str(path.relative_to(ROOT))
        for component in ALLOWED
        for path in sorted((ROOT / component).rglob("*.py"))
        if path.name not in ("__init__.py", "__main__.py") and path.name not in section
    ]
    assert not unnamed, f"add to docs/architecture.md's module map: {unnamed}"


# Storage reaches the file system only through storage/fs.py, so the crash simulator
# (tests/sim/simfs.py) sees every write, fsync and rename. batchwrite.py is the C
# write_batch's pure twin, which fs.py hands out; dump.py and cli.py are offline tools.
FS_SEAM_EXEMPT = {"fs.py", "batchwrite.py", "dump.py", "cli.py"}
IO_MODULES = {"os", "shutil", "fcntl", "io", "builtins", "tempfile", "mmap", "glob"}
OS_HARMLESS = {"PathLike", "getpid", "fspath", "strerror", "environ"}  # no file I/O
PATH_IO = {
    "read_text",
    "write_text",
    "write_bytes",
    "exists",
    "unlink",
    "mkdir",
    "rmdir",
    "iterdir",
    "glob",
    "rglob",
    "stat",
    "touch",
    "rename",
    "is_dir",
    "is_file",
    "scandir",
    "open",
    "samefile",
}


def file_system_calls(path: Path) -> list[str]:
    """Where a module touches the file system other than through ``fs``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            found += [
                f"{line}: imports {m}" for m in mods if m.split(".")[0] in IO_MODULES - {"os"}
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr not in OS_HARMLESS
        ):
            found.append(f"{line}: os.{node.attr}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                found.append(f"{line}: open()")
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in PATH_IO
                and not (isinstance(func.value, ast.Name) and func.value.id in ("fs", "Log"))
            ):
                found.append(f"{line}: .{func.attr}()")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_storage_touches_the_file_system_only_through_fs() -> None:
    wrong = [
        f"storage/{path.name}:{where}"
        for path in sorted((ROOT / "storage").glob("*.py"))
        if path.name not in FS_SEAM_EXEMPT
        for where in file_system_calls(path)
    ]
    assert not wrong, "go through rillet.storage.fs:\n" + "\n".join(wrong)


def test_fs_seam_checker_sees_direct_calls(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os, shutil\n"
        "def f(p, fd):\n"
        "    os.fsync(fd)\n"
        "    p.read_text()\n"
        "    open(p)\n"
        "    fs.unlink(p)\n"
        "    os.getpid()\n"
    )
    assert file_system_calls(module) == [
        "1: imports shutil",
        "3: os.fsync",
        "4: .read_text()",
        "5: open()",
    ]
