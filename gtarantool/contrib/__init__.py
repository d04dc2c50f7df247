"""Integrations apart from the connector's core: :mod:`.locust` (Locust users
that send gtarantool requests) and :mod:`.profiling` (greenlet-aware profiles).

Each needs an extra (``locust``, ``profile``); the core modules never import
this package.
"""
