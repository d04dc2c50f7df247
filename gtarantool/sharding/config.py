"""vshard's router configuration from a Tarantool 3 cluster configuration.

``vshard_cfg(config)`` reads the document ``tarantool --config`` reads (a
YAML file, or the same document as a dict, e.g. from etcd): every instance
whose ``sharding.roles`` include ``storage`` becomes a replica at the first
``iproto.listen`` uri, in a replica set named as in the configuration;
options are inherited global → group → replica set → instance, as Tarantool
does.  The user is ``iproto.advertise.sharding.login`` (the storages' own
sharding user) unless given, its password from ``credentials.users``.
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


def _uri(listen, name):
    if isinstance(listen, dict):
        listen = [listen]
    for item in listen or []:
        uri = item.get("uri") if isinstance(item, dict) else item
        if isinstance(uri, (str, int)):
            return uri
    raise ConfigurationError("storage %s has no iproto.listen uri" % name)


def vshard_cfg(config: Any, user: Optional[str] = None,
               password: Optional[str] = None) -> Tuple[Dict[str, Any], Optional[str],
                                                         Optional[str]]:
    """(vshard's router configuration, user, password) of a Tarantool 3 cluster
    configuration.

    :param config: a path to its YAML file, or the parsed document.
    :param user: the user to connect as (default: the storages' sharding login).
    :param password: its password (default: ``credentials.users[user].password``).
    :returns: ``({"bucket_count", "sharding"}, user, password)``.
    :raises tarantool.error.ConfigurationError: no storage, a storage without an
        address, or an unreadable document.
    """
    document = _load(config)
    groups = document.get("groups")
    if not isinstance(groups, dict):
        raise ConfigurationError("a cluster configuration needs groups")
    sharding: Dict[str, Any] = {}
    bucket_count = None
    for group in groups.values():
        for rs_name, rs in (group.get("replicasets") or {}).items():
            for name, instance in (rs.get("instances") or {}).items():
                scopes = [document, group, rs, instance or {}]
                if "storage" not in (_get(scopes, "sharding", "roles") or []):
                    continue
                if user is None:
                    user = _get(scopes, "iproto", "advertise", "sharding", "login")
                bucket_count = bucket_count or _get(scopes, "sharding", "bucket_count")
                replicas = sharding.setdefault(rs_name, {"name": rs_name, "master": "auto",
                                                         "replicas": {}})["replicas"]
                replica = {"uri": _uri(_get(scopes, "iproto", "listen"), name), "name": name}
                zone = _get(scopes, "sharding", "zone")
                if zone is not None:
                    replica["zone"] = zone
                replicas[name] = replica
    if not sharding:
        raise ConfigurationError("the configuration names no instance with the sharding "
                                 "role 'storage'")
    if password is None and user is not None:
        password = ((document.get("credentials") or {}).get("users") or {}).get(
            user, {}).get("password")
    return ({"bucket_count": bucket_count or DEFAULT_BUCKET_COUNT, "sharding": sharding},
            user, password)
