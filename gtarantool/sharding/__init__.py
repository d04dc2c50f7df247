"""``vshard.router`` in the client: :class:`Router` (bucket ids equal to vshard's,
calls straight to the replica set holding the bucket, map-reduce), its
:class:`Replicaset` objects, and vshard's errors (:class:`ShardingError`,
:class:`StorageError`, each with ``applied``).  ``Router.from_config`` reads a
Tarantool 3 cluster configuration; ``Router.from_router`` a Lua router's.
"""
from gtarantool.sharding.errors import ShardingError, StorageError
from gtarantool.sharding.hashing import bucket_id_mpcrc32, bucket_id_strcrc32, mpcrc32, strcrc32
from gtarantool.sharding.replicaset import Replicaset
from gtarantool.sharding.router import Router

__all__ = ["Router", "Replicaset", "ShardingError", "StorageError", "bucket_id_strcrc32",
           "bucket_id_mpcrc32", "strcrc32", "mpcrc32"]
