"""Server lists on the command line: ``--hosts h1:p1,h2:p2`` (a replica set for
``--pool``, or independent instances), parsed to and written from ``[(host, port), ...]``."""


def parse_hosts(text):
    """``"h1:p1,h2:p2"`` -> ``[("h1", p1), ("h2", p2)]`` (host defaults to 127.0.0.1)."""
    hosts = []
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError("expected HOST:PORT,... in --hosts, got %r" % part)
        hosts.append((host or "127.0.0.1", int(port)))
    if not hosts:
        raise ValueError("--hosts names no server")
    return hosts


def addresses(hosts):
    return ",".join("%s:%d" % hp for hp in hosts)
