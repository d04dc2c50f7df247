"""Forked children in tests: ``fork()`` and ``wait()`` that hold in any test order.

Once a process has used ``gevent.fork`` (a test before this one did), libev
reaps every child on SIGCHLD whenever the hub runs, and ``os.waitpid`` then
finds none.  A child forked here is watched from the moment it exists, so its
exit status is kept for ``wait`` whoever reaps it.
"""
import os
import signal

import gevent
import gevent.os


def fork(how=os.fork):
    """``how()`` (``os.fork``, or a fork made from C), the child watched at once.

    :returns: the child's pid in the parent, 0 in the child.
    """
    return gevent.os.fork_and_watch(fork=how)


def wait(pid, timeout=30):
    """The exit status of child ``pid`` (as ``os.waitpid``'s); killed first
    when it has not exited within ``timeout`` seconds."""
    try:
        with gevent.Timeout(timeout):
            return gevent.os.waitpid(pid, 0)[1]
    except gevent.Timeout:
        os.kill(pid, signal.SIGKILL)
        return gevent.os.waitpid(pid, 0)[1]
