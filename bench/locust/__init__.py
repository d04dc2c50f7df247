"""The bench workload under Locust: :mod:`bench.locust.locustfile` (``locust -f
bench/locust/locustfile.py``) and :mod:`bench.locust.run` (``python -m bench.locust_run``)."""
