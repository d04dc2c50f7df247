"""The distribution: ``python -m build`` makes an sdist and a wheel, and each
installs into a fresh venv and serves a request against a real server.

The wheel carries the C paths (on CPython 3.10+); the sdist installed with no C
compiler (``CC=false``) says that the C paths were skipped and runs the
pure-Python ones.  The installed package is imported from the venv, never from
this checkout.  Marked ``packaging``: ``pytest -m "not packaging"`` leaves it out
(it builds twice and installs the dependencies, from pip's cache when they are
there).
"""
import os
import shutil
import subprocess
import sys
import venv

import pytest

import gtarantool
from tests.conftest import PASSWORD, USER

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPPED = "gtarantool: the C paths were not built"

# Run in the fresh venv, from a directory outside the checkout.
CLIENT = r"""
import sys, gtarantool
host, port, user, password, key = sys.argv[1:]
try:
    from gtarantool import _speedups
    built = "c"
except ImportError:
    built = "python"
conn = gtarantool.connect(host, int(port), user=user, password=password)
conn.replace("kv", (key, 7))
row = conn.select("kv", key)[0]
conn.close()
print(gtarantool.__file__, gtarantool.__version__, built, row)
"""


def run(cmd, env=None, cwd=None):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, cwd=cwd)
    assert proc.returncode == 0, "%s failed:\n%s" % (" ".join(cmd), proc.stdout[-5000:])
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``python -m build`` of a copy of the checkout: {"sdist": path, "wheel": path}."""
    tmp = tmp_path_factory.mktemp("dist")
    # A copy without the working tree's builds and venvs: the sdist lists what it should.
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "*.so", "__pycache__", ".hypothesis",
        "profiles", "locust-report", "_build"))
    out = tmp / "out"
    run([sys.executable, "-m", "build", "--outdir", str(out), str(src)])
    files = {p.suffix: p for p in out.iterdir()}
    assert set(files) == {".gz", ".whl"}, sorted(out.iterdir())
    return {"sdist": files[".gz"], "wheel": files[".whl"]}


def install(tmp_path, name, target, env=None):
    """A fresh venv with ``target`` installed: (its python, pip's output)."""
    home = tmp_path / name
    venv.EnvBuilder(with_pip=True).create(home)
    python = str(home / "bin" / "python")
    output = run([python, "-m", "pip", "install", "-v", str(target)], env=env)
    return python, output


def request(python, server, key, cwd):
    out = run([python, "-c", CLIENT, server.host, str(server.port), USER, PASSWORD, key],
              cwd=cwd).split()
    path, version, built, row = out[0], out[1], out[2], " ".join(out[3:])
    assert not path.startswith(ROOT + os.sep)   # the venv's copy, not the checkout's
    assert version == gtarantool.__version__
    assert row == "['%s', 7]" % key
    return built


def test_wheel_installs_and_serves(dist, server, tmp_path):
    assert dist["wheel"].name.startswith("gtarantool-%s-" % gtarantool.__version__)
    python, output = install(tmp_path, "wheel-venv", dist["wheel"])
    built = request(python, server, "wheel", tmp_path)
    # CPython 3.10+ compiles the C paths into the wheel (the build machine has a compiler).
    assert built == ("c" if sys.version_info >= (3, 10) else "python")


def test_sdist_without_a_compiler_installs_the_python_paths(dist, server, tmp_path):
    env = dict(os.environ, CC="false")
    python, output = install(tmp_path, "sdist-venv", dist["sdist"], env=env)
    assert SKIPPED in output
    assert "gtarantool._speedups" in output.split(SKIPPED, 1)[1]
    assert request(python, server, "sdist", tmp_path) == "python"
