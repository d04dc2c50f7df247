from setuptools import Extension, find_packages, setup

setup(
    name="gtarantool",
    version="2.0.0",
    description="gevent connector for Tarantool: many greenlets, one socket",
    long_description=open("README.rst").read(),
    long_description_content_type="text/x-rst",
    packages=find_packages(include=["gtarantool", "gtarantool.*"]),
    # The hot paths in C (the request's, the reader's loops, request bodies);
    # without a compiler (or on Python < 3.10; < 3.11 for _encoder.c, which
    # uses PyFloat_Pack8) the build skips them and transport.py and
    # protocol.py run the same paths in Python.
    ext_modules=[Extension("gtarantool._speedups", ["gtarantool/_speedups.c"], optional=True),
                 Extension("gtarantool._encoder", ["gtarantool/_encoder.c"], optional=True),
                 # ConnectionPool's data methods (pool.py runs them in Python without it)
                 Extension("gtarantool._pool", ["gtarantool/_pool.c"], optional=True)],
    python_requires=">=3.8",
    install_requires=[
        "tarantool>=1.2,<2",
        "gevent>=22.10",
        "greenlet>=2.0",
        "msgpack>=1.0",
    ],
    extras_require={
        "profile": ["yappi>=1.6"],
        # 2.43.4: stats.bucket_response_time can be replaced (sub-millisecond buckets)
        "locust": ["locust>=2.43.4"],
        "bench": ["hdrhistogram>=0.10", "psutil>=5.9", "asynctnt>=2.0", "uvloop>=0.17",
                  "matplotlib>=3.5"],
        # gunicorn and uWSGI run examples/service (uWSGI builds with gcc and python3-dev)
        "test": ["pytest>=7", "pytest-timeout>=2.1", "pytest-rerunfailures>=12",
                 "hypothesis>=6.50", "psutil>=5.9",
                 "locust>=2.43.4", "gunicorn>=21.2", "uwsgi>=2.0.22"],
    },
    classifiers=[
        "Framework :: gevent",
        "Programming Language :: Python :: 3",
        "Topic :: Database :: Front-Ends",
    ],
)
