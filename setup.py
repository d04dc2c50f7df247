"""The C extensions; every other piece of metadata is in pyproject.toml.

The hot paths in C (the request's, the reader's loops, request bodies, the
pool's data methods) are optional: without a C compiler, or on a Python they do
not support, the build skips them, says so, and transport.py, protocol.py and
pool.py run the same paths in Python.
"""
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# name, source, the oldest CPython whose C API the source uses
EXTENSIONS = [
    ("gtarantool._speedups", "gtarantool/_speedups.c", (3, 10)),   # Py_NewRef
    ("gtarantool._encoder", "gtarantool/_encoder.c", (3, 11)),     # PyFloat_Pack8
    ("gtarantool._pool", "gtarantool/_pool.c", (3, 10)),           # ConnectionPool's data methods
]


class OptionalBuildExt(build_ext):
    """build_ext that skips an extension it cannot build and says why."""

    def run(self):
        self.skipped = []
        super().run()
        if self.skipped:
            lines = ["",
                     "gtarantool: the C paths were not built; the pure-Python paths run instead",
                     "(the same behaviour, more CPU per request):"]
            lines += ["  %s: %s" % item for item in self.skipped]
            lines += ["A C compiler (gcc) and Python's headers (python3-dev) build them.", ""]
            sys.stderr.write("\n".join(lines) + "\n")

    def build_extension(self, ext):
        skipped = self.__dict__.setdefault("skipped", [])
        if sys.implementation.name != "cpython":
            skipped.append((ext.name, "needs CPython"))
            return
        if sys.version_info[:2] < ext.min_python:
            skipped.append((ext.name, "needs Python %d.%d or later" % ext.min_python))
            return
        try:
            super().build_extension(ext)
        except Exception as exc:   # no compiler (CC=false, none installed), no headers
            reason = str(exc).strip() or type(exc).__name__
            skipped.append((ext.name, "could not be compiled (%s)" % reason))


def extension(name, source, min_python):
    ext = Extension(name, [source])
    ext.min_python = min_python
    return ext


setup(ext_modules=[extension(*spec) for spec in EXTENSIONS],
      cmdclass={"build_ext": OptionalBuildExt})
