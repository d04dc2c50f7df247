"""Throwaway Tarantools for tests and load runs: a server in a temp dir
(``server``), a replica set (``replicaset``) and a fault-injecting TCP proxy
(``faults``).  The test suite and ``bench/`` share them; a project of yours
can start the same servers in its own tests.
"""
