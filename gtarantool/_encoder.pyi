"""Type stub of the compiled module gtarantool._encoder (see _encoder.c): its names are typed Any."""
from typing import Any

def __getattr__(name: str) -> Any: ...
