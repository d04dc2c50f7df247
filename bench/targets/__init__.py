"""The server under load, as the runner sees it: :func:`open_target` picks one server
(``bench.targets.server``: an existing one or a throwaway embedded one), a replica set for
``--pool`` (``bench.targets.replicaset``) or many instances for ``--instances N`` /
``--hosts`` (``bench.targets.instances``).  Each target prepares the bench space, reads
``box.stat()`` and stops what it started when its block exits; a server that cannot be
used as asked raises :class:`SetupError`.  A SIGTERM while a target is open (``timeout``,
systemd, ``docker stop``) is a KeyboardInterrupt, so that what it started is stopped."""
import contextlib
import signal
import threading

from bench.targets.instances import open_instances_target
from bench.targets.replicaset import open_pool_target
from bench.targets.server import SetupError, Target, open_server_target
from bench.targets.sharded import open_sharded_target

__all__ = ["SetupError", "Target", "open_target"]


@contextlib.contextmanager
def open_target(config):
    """The context manager that yields the target of ``config``.

    :param config: a :class:`bench.core.config.Config`.
    :returns: a context manager; its target is closed (and what it started stopped) on exit.
    :raises SetupError: the server cannot be reached or set up as asked.
    """
    if config.shards:
        opened = open_sharded_target(config)
    elif config.pool:
        opened = open_pool_target(config)
    elif config.instances > 1 or config.hosts:
        opened = open_instances_target(config)
    else:
        opened = open_server_target(config)
    with _interrupted_by_sigterm(), opened as target:
        yield target


@contextlib.contextmanager
def _interrupted_by_sigterm():
    """SIGTERM raises KeyboardInterrupt in this block (the default would end the
    process and leave a throwaway server, which runs in its own session, behind)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
