"""The compiled modules, chosen once at import: ``speedups`` (``_speedups``: the
reader's and the request's hot paths), ``encoder`` (``_encoder``: request
bodies) and ``pool`` (``_pool``: the pool's data methods), each the module, or
None when the package was built without a compiler, or when the environment
variable ``GTARANTOOL_PURE_PYTHON`` is set (to anything but ``0``) at import:
then the Python twins run everywhere, as in a build without a compiler.

Callers read ``compiled.speedups`` / ``compiled.encoder`` when they build an
object (a transport, an encoder), so setting them to None (the tests'
``reader`` fixture does) makes new objects take the Python paths.
"""
import os
from types import ModuleType
from typing import Optional

__all__ = ["PURE_PYTHON", "encoder", "pool", "speedups"]

#: True when ``GTARANTOOL_PURE_PYTHON`` switched the compiled modules off.
PURE_PYTHON = os.environ.get("GTARANTOOL_PURE_PYTHON", "") not in ("", "0")

speedups: Optional[ModuleType] = None
encoder: Optional[ModuleType] = None
pool: Optional[ModuleType] = None
if not PURE_PYTHON:
    try:
        from gtarantool import _speedups as speedups
    except ImportError:   # built without a compiler: the same paths run in Python
        pass
    try:
        from gtarantool import _encoder as encoder
    except ImportError:
        pass
    try:
        from gtarantool import _pool as pool
    except ImportError:   # (also on Python < 3.10, which _pool.c does not build for)
        pass
