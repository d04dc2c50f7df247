"""Type stub of the compiled module gtarantool._encoder (_encoder.c): its names are typed Any."""
from typing import Any

def __getattr__(name: str) -> Any: ...
