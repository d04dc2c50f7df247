"""A fault campaign: seeded fault schedules against a recorded workload, and a
checker over the history (``python -m gtarantool.testing.chaos``, ``make chaos``).

``schedule`` draws the faults of one seed (the same seed, the same schedule);
``workload`` starts the servers, runs greenlets (and forked children) writing
operations the server can identify, injects the schedule and records every
operation in a ``history.History``; ``history.check`` returns the promises the
history breaks (an empty list when it keeps them all).  docs/testing.rst says
what is checked and how to replay a seed.
"""
