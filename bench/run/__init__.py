"""One run of the load generator: :mod:`bench.run.runner` (the parent: targets, worker
processes, barriers, the report) and :mod:`bench.run.worker` (one worker process)."""
