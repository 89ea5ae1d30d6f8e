"""The package layout: one distribution whose modules all live under `memdistill`, with imports that only
go down the floors (cli > eval > serve > runtime > train > data > metrics > core > spec)."""

import ast
import shutil
import subprocess
import sys
import zipfile

from tests.conftest import REPO

FLOORS = ["spec", "core", "metrics", "data", "train", "runtime", "serve", "eval", "cli"]
PACKAGE = REPO / "memdistill"


def _floor(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "memdistill" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in FLOORS else None


def _imports(path):
    """(line, imported module, imported names) for every import in a file, lazy ones inside functions too."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [a.name for a in node.names]


def _modules():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30, "the package moved: update this test"
    return files


def test_imports_only_go_down_the_floors():
    bad = []
    for path in _modules():
        rel = path.relative_to(PACKAGE)
        here = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if here not in FLOORS:  # __init__ / __main__ of the package itself
            continue
        for line, module, names in _imports(path):
            if module.split(".")[0] in ("tests", "memspec", "data_gen", "training", "serving", "eval"):
                bad.append(f"{rel}:{line}: imports {module} (not a product package)")
                continue
            there = _floor(module)
            if there is None or there == here:
                continue
            if FLOORS.index(there) > FLOORS.index(here):
                bad.append(f"{rel}:{line}: {here} imports {module}, a floor above it")
            private = [n for n in names if n.startswith("_")]
            if private:
                bad.append(f"{rel}:{line}: reaches into private names {private} of {module}")
    assert not bad, "\n".join(bad)


def test_floors_are_the_packages_on_disk():
    on_disk = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert on_disk == sorted(f for f in FLOORS if f != "cli")


def test_the_wheel_installs_only_memdistill(tmp_path):
    """`pip install .` puts one top-level package into site-packages: no `eval`, `training`, ... beside it."""
    src = tmp_path / "src"  # a copy: setuptools leaves a build/ folder beside the sources it builds
    shutil.copytree(REPO / "memdistill", src / "memdistill", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("memdistill-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"memdistill", next(t for t in top if t.endswith(".dist-info"))}, sorted(top)
    # every subpackage and the local evaluate module travel with it
    for floor in FLOORS[:-1]:
        assert f"memdistill/{floor}/__init__.py" in names
    assert "memdistill/metrics/dimmem_extraction/dimmem_extraction.py" in names
    assert "memdistill/data/fake_teacher.py" in names


def _module_name(path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """module -> the memdistill modules it imports, lazy imports inside functions included; `from a import b`
    counts as an import of the submodule a.b where there is one."""
    mods = {_module_name(p): p for p in _modules()}
    graph = {}
    for name, path in mods.items():
        edges = set()
        for _, module, names in _imports(path):
            if module.split(".")[0] != "memdistill":
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in mods]
            edges.update(subs or ([module] if module in mods else []))
            if len(subs) < len(names) and module in mods:
                edges.add(module)
        graph[name] = edges - {name}
    return graph


def test_no_import_cycle_lazy_imports_included():
    """A cycle (data.build -> data.label -> data.synth -> data.build, as it once was) works only while
    every import in it stays lazy; the graph of memdistill modules, lazy imports included, has none."""
    graph = _import_graph()
    assert graph["memdistill.data.label"] and "memdistill.spec.compact" in graph["memdistill.spec.router"]
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)
