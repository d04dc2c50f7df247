"""vshard's router configuration from a Tarantool 3 cluster configuration.

``vshard_cfg(config)`` reads the document ``tarantool --config`` reads (a
YAML file, or the same document as a dict, e.g. from etcd): every instance
whose ``sharding.roles`` include ``storage`` becomes a replica, in a replica
set named as in the configuration; options are inherited global → group →
replica set → instance, as Tarantool does.  Each replica is reached as
Tarantool 3's own router reaches it (``config:instance_uri('sharding')``):
at ``iproto.advertise.sharding.uri``, else (no ``advertise.sharding`` at
all) ``iproto.advertise.peer.uri``, else the first ``iproto.listen`` uri a
client can connect to (not ``0.0.0.0``, ``[::]`` or port 0); as that
advertise section's ``login`` (none: guest) with its ``password``, else the
login's password in ``credentials.users``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from tarantool.error import ConfigurationError

__all__ = ["vshard_cfg"]

DEFAULT_BUCKET_COUNT = 3000   # Tarantool 3's sharding.bucket_count default


def _get(scopes, *path):
    """The innermost scope's value at ``path`` (instance over replica set over
    group over global), or None."""
    for scope in reversed(scopes):
        value: Any = scope
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            return value
    return None


def _load(config):
    if isinstance(config, dict):
        return config
    try:
        import yaml
    except ImportError:
        raise ConfigurationError("reading a YAML configuration needs PyYAML (pip install "
                                 "pyyaml); or pass the configuration as a dict") from None
    with open(config, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    if not isinstance(document, dict):
        raise ConfigurationError("%s holds no cluster configuration" % (config,))
    return document


def _connectable(uri):
    """Whether a client can connect to the listen ``uri`` (Tarantool's
    uri_is_suitable_to_connect: not a wildcard address, not port 0)."""
    address = str(uri).rpartition("@")[2]
    if address.startswith(("unix/:", "/", "./")):
        return True
    host, _, port = address.rpartition(":")
    return host not in ("0.0.0.0", "[::]") and port != "0"


def _uri(listen, name):
    if isinstance(listen, dict):
        listen = [listen]
    for item in listen or []:
        uri = item.get("uri") if isinstance(item, dict) else item
        if isinstance(uri, (str, int)) and _connectable(uri):
            return uri
    raise ConfigurationError("storage %s has no iproto.listen uri a client can connect to "
                             "(and no iproto.advertise uri)" % name)


def _advertised(scopes):
    """{uri, login, password} of ``iproto.advertise.sharding``, else (that section
    absent) of ``iproto.advertise.peer``, as Tarantool's instance_uri picks them."""
    for section in ("sharding", "peer"):
        fields = {key: _get(scopes, "iproto", "advertise", section, key)
                  for key in ("uri", "login", "password", "params")}
        if any(value is not None for value in fields.values()):
            return fields
    return {}


def _password(document, login):
    """``credentials.users[login].password`` (guest has none)."""
    if login is None or login == "guest":
        return None
    users = (document.get("credentials") or {}).get("users") or {}
    return (users.get(login) or {}).get("password")


def vshard_cfg(config: Any, user: Optional[str] = None,
               password: Optional[str] = None) -> Tuple[Dict[str, Any], Optional[str],
                                                         Optional[str]]:
    """(vshard's router configuration, user, password) of a Tarantool 3 cluster
    configuration.

    :param config: a path to its YAML file, or the parsed document.
    :param user: the user to connect to every storage as (default: each
        storage's advertised sharding login, as above).
    :param password: its password (default: ``credentials.users[user].password``).
    :returns: ``({"bucket_count", "sharding"}, user, password)``: each replica's
        ``uri`` a table ``{"uri", "login", "password"}`` (as Tarantool gives vshard),
        ``user`` and ``password`` the given ones, else the first storage's.
    :raises tarantool.error.ConfigurationError: no storage, a storage without an
        address, or an unreadable document.
    """
    document = _load(config)
    groups = document.get("groups")
    if not isinstance(groups, dict):
        raise ConfigurationError("a cluster configuration needs groups")
    sharding: Dict[str, Any] = {}
    bucket_count = None
    first = None   # the first storage's (login, password)
    for group in groups.values():
        for rs_name, rs in (group.get("replicasets") or {}).items():
            for name, instance in (rs.get("instances") or {}).items():
                scopes = [document, group, rs, instance or {}]
                if "storage" not in (_get(scopes, "sharding", "roles") or []):
                    continue
                advertised = _advertised(scopes)
                if user is not None:   # given: every storage's (Tarantool's opts.login)
                    login, secret = user, password
                else:
                    login, secret = advertised.get("login"), advertised.get("password")
                if secret is None:
                    secret = _password(document, login)
                if first is None:
                    first = (login, secret)
                bucket_count = bucket_count or _get(scopes, "sharding", "bucket_count")
                replicas = sharding.setdefault(rs_name, {"name": rs_name, "master": "auto",
                                                         "replicas": {}})["replicas"]
                address = advertised.get("uri")
                if address is None:
                    address = _uri(_get(scopes, "iproto", "listen"), name)
                uri = {"uri": address}
                if login is not None and login != "guest":   # (guest: no authentication)
                    uri["login"] = login
                    if secret is not None:
                        uri["password"] = secret
                replica = {"uri": uri, "name": name}
                zone = _get(scopes, "sharding", "zone")
                if zone is not None:
                    replica["zone"] = zone
                replicas[name] = replica
    if not sharding:
        raise ConfigurationError("the configuration names no instance with the sharding "
                                 "role 'storage'")
    if user is None:
        user, password = first or (None, None)   # (set with the first storage)
    elif password is None:
        password = _password(document, user)
    return ({"bucket_count": bucket_count or DEFAULT_BUCKET_COUNT, "sharding": sharding},
            user, password)
