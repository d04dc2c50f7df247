"""Commands built on runs: compare, perf, sweep, instructions, poolcompare, soak, tx; each
module's ``main`` is a ``python -m bench.<name>`` entry point."""
