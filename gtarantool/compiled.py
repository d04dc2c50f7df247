"""The compiled modules, chosen once at import: ``speedups`` (``_speedups``: the
reader's and the request's hot paths), ``encoder`` (``_encoder``: request
bodies) and ``pool`` (``_pool``: the pool's data methods), each the module, or
None when the package was built without a compiler.

Callers read ``compiled.speedups`` / ``compiled.encoder`` when they build an
object (a transport, an encoder), so setting them to None (the tests'
``reader`` fixture does) makes new objects take the Python paths.
"""
from types import ModuleType
from typing import Optional

speedups: Optional[ModuleType]
encoder: Optional[ModuleType]
pool: Optional[ModuleType]
try:
    from gtarantool import _speedups
    speedups = _speedups
except ImportError:   # built without a compiler: the same paths run in Python
    speedups = None
try:
    from gtarantool import _encoder
    encoder = _encoder
except ImportError:
    encoder = None
try:
    from gtarantool import _pool
    pool = _pool
except ImportError:   # (also on Python < 3.10, which _pool.c does not build for)
    pool = None
