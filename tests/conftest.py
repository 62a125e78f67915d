import os
import subprocess
import sys

import pytest

# Tests run XLA:CPU tuned as the CLI runs the GAN (single-threaded); before JAX starts.
from flaxport.harness.cpu import tune_for_tiny_models  # noqa: E402

tune_for_tiny_models()


def run_cli(*args, cwd=None, env=None):
    """Run `python -m flaxport ARGS` in a fresh process; returns CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "flaxport", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=600)


@pytest.fixture
def cli():
    return run_cli
