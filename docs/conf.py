"""Sphinx configuration of gtarantool's manual (make docs)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import gtarantool  # noqa: E402 - after the path is set

project = "gtarantool"
release = gtarantool.__version__
version = ".".join(release.split(".")[:2])
copyright = "gtarantool contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "sphinx.ext.graphviz",   # the data path diagram (make docs installs dot)
]
graphviz_output_format = "svg"

autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
autodoc_typehints = "description"
# (A parameter a docstring leaves to tarantool-python's documentation gets no bare entry.)
autodoc_typehints_description_target = "documented_params"

exclude_patterns = ["_build"]

# Every cross-reference must resolve (make docs fails otherwise), except names of
# the libraries gtarantool builds on, whose manuals are not linked from this one.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"tarantool\..*"),          # tarantool-python
    (r"py:.*", r"locust\..*"),             # Locust, TarantoolUser's bases
    (r"py:.*", r"collections\.abc\..*"),   # type hints
    (r"py:.*", r"opentelemetry\..*"),      # the instrumentor's base
]
nitpick_ignore = [
    ("py:class", "Mode"),   # tarantool.Mode in the pool's type hints
]
html_theme = "furo"
html_title = "gtarantool %s" % release


def _paramref(name, rawtext, text, lineno, inliner, options=None, content=None):
    """tarantool-python's docstrings, which Connection inherits, name parameters
    with sphinx-paramlinks' role: shown here as the parameter's name."""
    from docutils import nodes
    return [nodes.literal(rawtext, text.rsplit(".", 1)[-1])], []


_MISSING = object()


def _find(path):
    """The object a dotted ``path`` names (importing what it needs), or _MISSING."""
    import importlib
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                break
        return obj
    return _MISSING


def _documented(env):
    """{id(object): the name the manual documents it under}, built once per build."""
    names = getattr(env, "_gtarantool_documented", None)
    if names is None:
        names = {}
        for name in sorted(env.get_domain("py").objects, key=len):
            obj = _find(name)
            if obj is not _MISSING:
                names.setdefault(id(obj), name)
        env._gtarantool_documented = names
    return names


def _alias(app, env, node, contnode):
    """Resolve a reference that names a documented object another way: by the
    module that defines it (``gtarantool.pipeline.Pipeline.results`` for
    ``gtarantool.Pipeline.results``), or unqualified in a docstring of that
    module (``Replicaset`` in ``Router``'s).  Anything else stays unresolved."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    obj = _find(target) if "." in target else _MISSING
    if obj is _MISSING:
        context = node.get("py:module")
        if node.get("py:class"):
            context += "." + node["py:class"]
        where = _find(context) if context else _MISSING
        home = sys.modules.get(getattr(where, "__module__", None) or "")
        if home is None and isinstance(where, type(sys)):
            home = where
        obj = _find("%s.%s" % (home.__name__, target)) if home is not None else _MISSING
    name = _documented(env).get(id(obj)) if obj is not _MISSING else None
    if name is None:
        return None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, "obj", name,
                                             node, contnode)


def setup(app):
    app.add_role("paramref", _paramref)
    app.connect("missing-reference", _alias)
