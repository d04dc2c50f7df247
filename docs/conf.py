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
html_theme = "furo"
html_title = "gtarantool %s" % release


def _paramref(name, rawtext, text, lineno, inliner, options=None, content=None):
    """tarantool-python's docstrings, which Connection inherits, name parameters
    with sphinx-paramlinks' role: shown here as the parameter's name."""
    from docutils import nodes
    return [nodes.literal(rawtext, text.rsplit(".", 1)[-1])], []


def setup(app):
    app.add_role("paramref", _paramref)
