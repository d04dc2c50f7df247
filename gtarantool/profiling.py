"""An alias of :mod:`gtarantool.contrib.profiling`, the greenlet-aware profiler:
``from gtarantool.profiling import profile, profile_for`` keeps working."""
from gtarantool.contrib.profiling import Profiler, profile, profile_for

__all__ = ["Profiler", "profile", "profile_for"]
