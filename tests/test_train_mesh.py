"""train_step.py on a jax.sharding.Mesh: data parallel (the batch over `data`) and FSDP
(parameters and optimizer moments over `fsdp`) on 4 simulated CPU devices take the steps of one
device (float64 to 1e-12, float32 to 1e-5), BatchNorm over the global batch; the same file runs
without a mesh unchanged. The runs happen where neither flaxport nor torch can be imported.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

from flaxport.translate import translate  # noqa: E402
from flaxport.translate.train_step import write_train_step  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from translate_zoo import _REFUSE  # noqa: E402

STEPS = 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 6)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc2(torch.relu(self.fc1(h.flatten(1))))


# Each script's start: the written model.py and train_step.py of the folder `out`, imported as files.
LOAD_FILES = """

def load(name):
    spec = importlib.util.spec_from_file_location(name, out + "/" + name + ".py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model_py, train_step_py = load("model"), load("train_step")
"""


RUN = """
import importlib.util, json, sys
import jax
x64 = sys.argv[2] == "float64"
jax.config.update("jax_enable_x64", x64)
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

out = sys.argv[1]

""" + LOAD_FILES + """x, y = np.load(out + "/x.npy"), np.load(out + "/y.npy")
dtype = jnp.float64 if x64 else jnp.float32
x = x.astype(dtype)


def run(mesh):
    model = model_py.load(out)
    nnx.update(model, jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                                   nnx.state(model)))
    train_step, state, write_back = train_step_py.make_train_step(model, mesh=mesh)
    # how many ways the most split parameter is split
    split = max(int(leaf.size // np.prod(leaf.sharding.shard_shape(leaf.shape))) for leaf in state[0]) if mesh else 1
    losses = []
    for _ in range(int(sys.argv[3])):
        state, loss = train_step(state, x, y)
        losses.append(float(loss))
    write_back(state)
    flat = {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))
            if jnp.issubdtype(np.asarray(v.get_value()).dtype, jnp.floating)}
    return flat, losses, split


devices = np.array(jax.devices())
one, one_losses, _ = run(None)
report = {"devices": len(devices), "runs": {}}
for name, mesh in (("data=4", Mesh(devices, ("data",))), ("fsdp=4", Mesh(devices, ("fsdp",))),
                   ("data=2,fsdp=2", Mesh(devices.reshape(2, 2), ("data", "fsdp"))),
                   ("data=1", Mesh(devices[:1], ("data",)))):
    got, losses, split = run(mesh)
    worst = max(float(np.max(np.abs(got[k] - one[k]))) for k in one)
    report["runs"][name] = {"params": worst, "loss": float(np.max(np.abs(np.array(losses) - one_losses))),
                            "split": split}
json.dump(report, open(out + "/mesh.json", "w"))
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    torch.manual_seed(0)
    module = Net().train()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 6, (8,), generator=g)
    t = translate(module, x)
    write_train_step(t, module, "torch.optim.AdamW(lr=1e-2, weight_decay=0.1)", "F.cross_entropy", check=False)
    out = tmp_path_factory.mktemp("mesh")
    t.save(out)
    np.save(out / "x.npy", x.numpy())
    np.save(out / "y.npy", y.numpy().astype(np.int32))
    return out


def _run(out, dtype):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    subprocess.run([sys.executable, "-c", _REFUSE + textwrap.dedent(RUN), str(out), dtype, str(STEPS)], check=True,
                   timeout=600, env=env)
    return json.loads((out / "mesh.json").read_text())


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_data_parallel_and_fsdp_on_four_devices_equal_one(written, dtype, tol):
    report = _run(written, dtype)
    assert report["devices"] == 4
    for name, run in report["runs"].items():
        assert run["params"] <= tol and run["loss"] <= tol, (name, run)
    # FSDP really splits: fc1.weight (32, 128) is held a quarter a device
    assert report["runs"]["fsdp=4"]["split"] == 4 and report["runs"]["data=2,fsdp=2"]["split"] == 2
    assert report["runs"]["data=4"]["split"] == 1


HOSTS = """
import importlib.util, json, sys
import jax
out, pid, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid, initialization_timeout=120)
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

""" + LOAD_FILES + """x, y = np.load(out + "/x.npy").astype(np.float64), np.load(out + "/y.npy")
rows = slice(pid * len(x) // 2, (pid + 1) * len(x) // 2)  # this process's rows of the global batch
model = model_py.load(out)
nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                               nnx.state(model)))
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
train_step, state, write_back = train_step_py.make_train_step(model, mesh=mesh)
for _ in range(int(sys.argv[4])):
    state, loss = train_step(state, x[rows], y[rows])
write_back(state)
if pid == 0:
    flat = {"/".join(map(str, p)): np.asarray(v.get_value()).tolist() for p, v in nnx.to_flat_state(nnx.state(model))
            if jnp.issubdtype(np.asarray(v.get_value()).dtype, jnp.floating)}
    json.dump({"devices": len(jax.devices()), "loss": float(loss), "state": flat}, open(out + "/hosts.json", "w"))
"""


def test_two_processes_on_loopback_equal_one(written):
    """2 processes of 2 CPU devices each (jax.distributed, gloo over loopback), a data=2,fsdp=2 mesh
    across them, each feeding its half of the batch: the parameters of one device, float64."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    procs = [subprocess.Popen([sys.executable, "-c", _REFUSE + textwrap.dedent(HOSTS), str(written), str(i), str(port),
                               str(STEPS)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    hosts = json.loads((written / "hosts.json").read_text())
    assert hosts["devices"] == 4
    reference = json.loads(subprocess.run(
        [sys.executable, "-c", _REFUSE + textwrap.dedent(SINGLE), str(written), str(STEPS)], check=True, timeout=600,
        capture_output=True, text=True).stdout)
    worst = max(float(np.max(np.abs(np.array(hosts["state"][k]) - np.array(v)))) for k, v in reference.items())
    assert worst <= 1e-12, worst


SINGLE = """
import importlib.util, json, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from flax import nnx
out = sys.argv[1]

""" + LOAD_FILES + """x, y = np.load(out + "/x.npy").astype(np.float64), np.load(out + "/y.npy")
model = model_py.load(out)
nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                               nnx.state(model)))
train_step, state, write_back = train_step_py.make_train_step(model)
for _ in range(int(sys.argv[2])):
    state, loss = train_step(state, x, y)
write_back(state)
print(json.dumps({"/".join(map(str, p)): np.asarray(v.get_value()).tolist() for p, v in nnx.to_flat_state(
    nnx.state(model)) if jnp.issubdtype(np.asarray(v.get_value()).dtype, jnp.floating)}))
"""


@pytest.mark.slow
def test_the_mesh_benchmark_runs():
    """`python -m flaxport.bench.train_mesh`: the three variants timed (their figures are in benchmarks.md)."""
    run = subprocess.run([sys.executable, "-m", "flaxport.bench.train_mesh", "--rounds", "1", "--calls", "1"],
                         capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(run.stdout.splitlines()[-1])
    assert set(result["step_ms"]) == {"no mesh", "mesh data=1", "mesh data=1,fsdp=1"}
    assert all(ms > 0 for ms in result["step_ms"].values())
