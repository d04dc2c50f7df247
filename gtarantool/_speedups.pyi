"""Type stub of the compiled module gtarantool._speedups (see _speedups.c): its names are typed Any."""
from typing import Any

def __getattr__(name: str) -> Any: ...
