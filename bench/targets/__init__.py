"""The server under load, as the runner sees it: :func:`open_target` picks one server
(``bench.targets.server``: an existing one or a throwaway embedded one), a replica set for
``--pool`` (``bench.targets.replicaset``) or many instances for ``--instances N`` /
``--hosts`` (``bench.targets.instances``).  Each target prepares the bench space, reads
``box.stat()`` and stops what it started when its block exits; a server that cannot be
used as asked raises :class:`SetupError`."""
from bench.targets.instances import open_instances_target
from bench.targets.replicaset import open_pool_target
from bench.targets.server import SetupError, Target, open_server_target
from bench.targets.sharded import open_sharded_target

__all__ = ["SetupError", "Target", "open_target"]


def open_target(config):
    """The context manager that yields the target of ``config``.

    :param config: a :class:`bench.core.config.Config`.
    :returns: a context manager; its target is closed (and what it started stopped) on exit.
    :raises SetupError: the server cannot be reached or set up as asked.
    """
    if config.shards:
        return open_sharded_target(config)
    if config.pool:
        return open_pool_target(config)
    if config.instances > 1 or config.hosts:
        return open_instances_target(config)
    return open_server_target(config)
