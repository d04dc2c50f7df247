"""Type stub of the compiled module gtarantool._pool (see _pool.c): its names are typed Any."""
from typing import Any

def __getattr__(name: str) -> Any: ...
