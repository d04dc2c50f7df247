"""Profiles of the worker processes (``--profile DIR``) and ``python -m bench.profile``, which
reads and compares callgrind files."""
