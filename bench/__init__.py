"""The load generator for Tarantool (``python -m bench``, ``make bench``).

Packages, each importing only from the ones listed before it:

- ``bench.core``: the run's configuration, workloads, HDR recorder, report and plot;
- ``bench.profiling``: callgrind profiles of worker processes and their comparison;
- ``bench.drivers``: the clients under load (gtarantool, sync, threads, asynctnt, pool);
- ``bench.targets``: the server under load (one server, a replica set, many instances);
- ``bench.run``: one run: the parent process and its worker processes;
- ``bench.suites``: commands built on runs (compare, perf, sweep, instructions, ...);
- ``bench.locust``: the bench's workload as a Locust scenario and its headless runner.

The modules at this level (``bench.compare``, ``bench.perf`` ...) are the ``python -m``
entry points of those commands.  The throwaway servers come from ``gtarantool.testing``.
"""
