"""bench/'s layout: packages import only from the packages below them, every import of a
bench module sits at module level (none hides a cycle inside a function), the modules'
imports form no cycle, and the library's tests (tests/) never import the load generator."""
import ast
import graphlib
import os

import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH)
# A package imports from its own modules and from packages of lower rank only.
RANK = {"core": 0, "profiling": 1, "drivers": 2, "targets": 2, "run": 3, "suites": 4,
        "locust": 4, "": 5}   # "": the python -m entry points at bench/'s top


def python_files(top, skip=()):
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith((".", "__"))]
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def bench_imports(path):
    """[(imported bench module, at module level?)] of the file at ``path``."""
    tree = ast.parse(open(path).read(), path)
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from bench.core import config" imports the module bench.core.config
            names = [node.module + "." + alias.name for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name == "bench" or name.startswith("bench."):
                found.append((name, id(node) in top))
    return found


def package(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else ""


MODULES = {module_name(p): p for p in python_files(BENCH, skip=("tests",))}


def resolve(name):
    """The bench module ``name`` is, or the package it names (None: a name in a module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_every_package_has_a_rank():
    assert {package(m) for m in MODULES} == set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_one_way_at_module_level(module):
    mine = package(module)
    for name, at_top in bench_imports(MODULES[module]):
        target = resolve(name)
        if target in (None, "bench", module):   # (bench/__init__.py imports nothing)
            continue
        assert at_top, "%s imports %s inside a function" % (module, name)
        theirs = package(target)
        assert theirs == mine or RANK[theirs] < RANK[mine], (
            "%s (%s) imports %s (%s)" % (module, mine or "top", target, theirs or "top"))


def test_no_import_cycle():
    graph = {module: {resolve(name) for name, _ in bench_imports(path)} - {None, "bench", module}
             for module, path in MODULES.items()}
    # a package's __init__ runs before its modules: importing bench.x.y imports bench.x
    for module in MODULES:
        parent = module.rpartition(".")[0]
        if parent in MODULES and parent != "bench":
            graph[module].discard(parent)
    graphlib.TopologicalSorter(graph).prepare()   # raises CycleError on a cycle


def test_library_tests_never_import_bench():
    for path in python_files(os.path.join(ROOT, "tests")):
        assert bench_imports(path) == [], path
