"""The process ``python -m bench.locust_run --instructions N`` counts under callgrind:
``python -m bench.locust.counted N URL [bench.locust_run options]`` runs
bench/locust/locustfile.py's users (USERS/PROCS of them) in its own Locust runner until
they have made ``N`` requests, then prints ``requests M``, how many they made.

It is a module of its own because importing Locust monkey-patches the whole process: only
this child may do it, never ``bench.locust.run``'s process."""
import os
import sys

import gevent
import locust.argument_parser
from locust import events
from locust.env import Environment

from bench.locust import locustfile
from bench.locust.run import parse_args


def main(argv=None):
    """:param argv: ``[N, URL, option...]``, the options those of ``bench.locust_run``.
    :returns: the exit code, 0."""
    argv = sys.argv[1:] if argv is None else argv
    n, url, args = int(argv[0]), argv[1], parse_args(argv[2:])
    options = locust.argument_parser.get_parser().parse_args(
        ["-f", os.path.abspath(locustfile.__file__), "--host", url, "--bench-mix", args.mix,
         "--bench-keys", str(args.keys), "--bench-size", str(args.size),
         "--bench-distribution", args.distribution, "--bench-space", args.space]
        + (["--bench-noop"] if args.noop else []))
    environment = Environment(user_classes=[locustfile.BenchUser], host=url, events=events,
                              parsed_options=options)
    runner = environment.create_local_runner()
    users = max(1, args.users // args.procs)
    runner.start(users, spawn_rate=users)
    while environment.stats.total.num_requests < n:
        gevent.sleep(0.01)
    runner.quit()
    print("requests %d" % environment.stats.total.num_requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
