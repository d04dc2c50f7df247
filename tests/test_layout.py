"""gtarantool's layout: its modules' imports form no cycle (imports inside
functions counted), the protocol layer (``gtarantool/protocol/``) does no I/O
and stands on nothing of the library but its errors and the compiled modules,
and every IPROTO code, key and error code is defined once, in
``gtarantool/protocol/constants.py``."""
import ast
import glob
import graphlib
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "gtarantool")
# What the protocol layer may import of the library (besides its own modules).
PROTOCOL_MAY_IMPORT = {"gtarantool.errors", "gtarantool.compiled"}
# Standard modules of I/O and scheduling that the protocol layer never imports.
IO_MODULES = ("gevent", "socket", "select", "selectors", "ssl", "asyncio", "threading")
# Constants defined outside protocol/constants.py: module prefix -> why.
UNMOVED_CONSTANTS: dict = {}
CONSTANT_PREFIXES = ("IPROTO_", "REQUEST_TYPE_", "ER_")


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _python_files():
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


MODULES = {_module_name(path): path for path in _python_files()}
# The compiled extensions are modules too (they import nothing of the library).
EXTENSIONS = {"gtarantool." + os.path.basename(path)[:-2]
              for path in glob.glob(os.path.join(PACKAGE, "_*.c"))}


def _resolve(name):
    """The library module ``name`` is or lies in (None: not the library's)."""
    if name in EXTENSIONS:
        return name
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path):
    """Every module ``path`` imports, at any depth (in functions too)."""
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "%s: a relative import" % path
            for alias in node.names:
                # "from gtarantool import compiled" imports the module gtarantool.compiled
                full = node.module + "." + alias.name
                found.add(full if _resolve(full) == full else node.module)
    return found


def _library_imports(path, module):
    return {_resolve(name) for name in _imports(path)} - {None, module}


def test_the_modules_form_no_import_cycle():
    graph = {module: _library_imports(path, module) for module, path in MODULES.items()}
    # Importing gtarantool.x.y runs gtarantool/__init__.py and gtarantool/x/__init__.py
    # first: that order is Python's, not an edge of the module's own.
    for module, targets in graph.items():
        parent = module.rpartition(".")[0]
        while parent:
            targets.discard(parent)
            parent = parent.rpartition(".")[0]
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail("import cycle: %s" % " -> ".join(exc.args[1]))


PROTOCOL = sorted(module for module in MODULES if module.startswith("gtarantool.protocol"))


def test_the_protocol_layer_exists():
    assert {"gtarantool.protocol", "gtarantool.protocol.constants", "gtarantool.protocol.frames",
            "gtarantool.protocol.codec", "gtarantool.protocol.responses"} <= set(PROTOCOL)


@pytest.mark.parametrize("module", PROTOCOL)
def test_the_protocol_layer_does_no_io(module):
    imported = _imports(MODULES[module])
    io = {name for name in imported if name.split(".")[0] in IO_MODULES}
    assert not io, "%s imports %s" % (module, ", ".join(sorted(io)))
    library = {target for target in _library_imports(MODULES[module], module)
               if not target.startswith("gtarantool.protocol")}
    assert library <= PROTOCOL_MAY_IMPORT, (
        "%s imports %s" % (module, ", ".join(sorted(library - PROTOCOL_MAY_IMPORT))))


def test_the_compiled_modules_are_imported_in_one_place():
    wanted = {"gtarantool._speedups", "gtarantool._encoder", "gtarantool._pool"}
    importers = {module for module, path in MODULES.items()
                 if wanted & _library_imports(path, module)}
    assert importers == {"gtarantool.compiled"}


def _constants(path):
    """Names of the IPROTO codes, keys and error codes that ``path`` assigns a number."""
    tree = ast.parse(open(path).read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and type(node.value.value) is int:
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith(CONSTANT_PREFIXES):
                    yield target.id


def test_each_constant_is_defined_once():
    home = "gtarantool.protocol.constants"
    defined = set(_constants(MODULES[home]))
    assert {"IPROTO_STREAM_ID", "IPROTO_WATCH", "ER_WRONG_SCHEMA_VERSION"} <= defined
    for module, path in MODULES.items():
        if module == home or module.startswith(tuple(UNMOVED_CONSTANTS)):
            continue
        assert not list(_constants(path)), "%s defines %s" % (module, list(_constants(path)))


def test_the_constants_defined_here_are_not_tarantool_pythons():
    from tarantool import const

    from gtarantool.protocol import constants
    tree = ast.parse(open(MODULES["gtarantool.protocol.constants"]).read())
    own = {target.id for node in tree.body if isinstance(node, ast.Assign)
           for target in node.targets if isinstance(target, ast.Name)}
    assert not own & set(vars(const)), "tarantool.const has %s" % sorted(own & set(vars(const)))
    assert constants.IPROTO_DATA == const.IPROTO_DATA   # its own, re-exported


# The calls that look a Python attribute up by a name written in C, and the
# transport's hook table, whose names the C code looks up on a transport.
_NAMED_LOOKUPS = re.compile(r"(?:PyUnicode_InternFromString|PyObject_(?:Get|Set|Has|Del)AttrString"
                            r"|PyObject_CallMethod)\(\s*(?:[^,()]*,\s*)?\"([^\"]*)\"")
_HOOK_TABLE = re.compile(r"hook_names\[N_HOOKS\] = \{([^}]*)\}")


@pytest.mark.parametrize("source", sorted(glob.glob(os.path.join(PACKAGE, "_*.c"))),
                         ids=os.path.basename)
def test_the_c_code_looks_up_no_private_attribute_by_name(source):
    """The C paths reach the state they share with Python through their core
    types' fields and go back to Python through documented hooks: no private
    attribute of a Python object is looked up by name."""
    text = open(source).read()
    names = set(_NAMED_LOOKUPS.findall(text))
    for table in _HOOK_TABLE.findall(text):
        names |= set(re.findall(r"\"([^\"]*)\"", table))
    if source.endswith("_speedups.c"):   # (the patterns find what they are for)
        assert {"responses", "request_general", "flush"} <= names
    private = [name for name in names
               if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))]
    assert not private


def test_the_pool_and_the_router_are_imported_when_first_named():
    code = ("import sys, gtarantool, gtarantool.copy.cli\n"
            "before = [m for m in ('gtarantool.pool', 'gtarantool.sharding') if m in sys.modules]\n"
            "from gtarantool import ConnectionPool, Router, Mode\n"
            "print(before, ConnectionPool.__module__, Router.__module__, Mode.RW.name,\n"
            "      'Router' in dir(gtarantool), hasattr(gtarantool, 'no_such_name'))")
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         check=True).stdout.split()
    assert out == ["[]", "gtarantool.pool.connection_pool", "gtarantool.sharding.router", "RW",
                   "True", "False"]


# ``pip install gtarantool`` fetches PyPI's gtarantool, another project.
PIP_FROM_PYPI = re.compile(r"""pip install\s+(-\S+\s+)*['"]?gtarantool\b""")


def _texts_users_read():
    for pattern in ("README.rst", "CONTRIBUTING.rst", "docs/*.rst", "examples/**/*.py",
                    "gtarantool/**/*.py", "bench/**/*.py"):
        yield from glob.glob(os.path.join(ROOT, pattern), recursive=True)


def test_no_text_installs_pypis_gtarantool():
    """What the docs, the messages and the examples tell a user to install is
    this checkout (``pip install .``, ``'.[extra]'``), never ``gtarantool`` by
    name, but where the README and the install guide say it is not this one."""
    found = []
    for path in _texts_users_read():
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if PIP_FROM_PYPI.search(line) and "not this project" not in line:
                    found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number,
                                                line.strip()))
    assert not found, "\n".join(found)
