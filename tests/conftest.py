import os
import subprocess
import sys

import pytest

# Tests run single-threaded XLA like the CLI does for the GAN; set before jax loads.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")


def run_cli(*args, cwd=None, env=None):
    """Run `python -m flaxport ARGS` in a fresh process; returns CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "flaxport", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=600)


@pytest.fixture
def cli():
    return run_cli
