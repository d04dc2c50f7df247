"""The compiled modules, chosen once at import: ``speedups`` (``_speedups``: the
reader's and the request's hot paths) and ``encoder`` (``_encoder``: request
bodies), each the module or None when the package was built without a compiler.

Callers read ``compiled.speedups`` / ``compiled.encoder`` when they build an
object (a transport, an encoder), so setting them to None (the tests'
``reader`` fixture does) makes new objects take the Python paths.
"""
from types import ModuleType
from typing import Optional

speedups: Optional[ModuleType]
encoder: Optional[ModuleType]
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
