"""The core modules of gtarantool never import the integrations (gtarantool.contrib),
at module level or inside a function; only the two alias modules do."""
import ast
import os

import gtarantool

PACKAGE = os.path.dirname(os.path.abspath(gtarantool.__file__))
ALIASES = {"locust.py", "profiling.py"}   # gtarantool.locust, gtarantool.profiling


def imported_modules(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from (node.module + "." + alias.name for alias in node.names)


def test_core_modules_do_not_import_contrib():
    offenders = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d not in ("contrib", "__pycache__")]
        for name in files:
            if not name.endswith(".py") or (folder == PACKAGE and name in ALIASES):
                continue
            path = os.path.join(folder, name)
            offenders += ["%s: %s" % (os.path.relpath(path, PACKAGE), module)
                          for module in imported_modules(path)
                          if module.startswith("gtarantool.contrib")]
    assert offenders == []


def test_aliases_import_contrib():
    """The check above sees imports of contrib where there are some."""
    for name in ALIASES:
        assert any(module.startswith("gtarantool.contrib")
                   for module in imported_modules(os.path.join(PACKAGE, name)))
