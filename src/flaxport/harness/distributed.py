"""Data parallelism over devices and hosts: joining a job, the mesh, the batches.

A run trains on a 1-D `Mesh` of devices along the axis `data`. Every step's global
batch is split along it; the train state (parameters, optimizer state, BatchNorm
statistics) and the random keys are replicated. Under jit, XLA inserts the all-reduces,
so a mean over the batch (a loss, a BatchNorm statistic) is the mean over the *global*
batch: sync BatchNorm without pmap, and the same numbers as one device up to the order
of the additions.

With one device in one process there is no mesh at all: `Placement.single()` leaves
every array where JAX puts it, so the single-device loop is the code it always was.

Several processes (hosts) join through `join` (jax.distributed) before JAX creates
its backends. Each process holds the (small) dataset in host memory, but only its
share of every global batch goes to its devices (`ShareFeed`). Within one process
the whole training set stays on every device (`epoch.ResidentFeed`): no transfer
at all once training runs.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time

import numpy as np

from flaxport.errors import UserError, first_line

DATA = "data"  # the mesh axis the batch is split along

# Environment variables that ask for a multi-process run (the flags win):
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


def _cluster_launch() -> bool:
    """Launched as one of several tasks by SLURM's srun or Open MPI's mpirun.

    Only then may jax.distributed.initialize() detect its arguments: a single-task
    allocation (an interactive `salloc` shell, `srun -n1`) stays a one-process run.
    """
    env = os.environ
    if "SLURM_STEP_NODELIST" in env and "SLURM_PROCID" in env:  # inside an srun step
        return int(env.get("SLURM_NTASKS", "1") or 1) > 1
    return int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1


def join(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None) -> bool:
    """Join a multi-process JAX job when asked; returns whether this is one.

    Asked by the flags (--coordinator HOST:PORT --num-processes N --process-id I), by
    $JAX_COORDINATOR_ADDRESS / $JAX_NUM_PROCESSES / $JAX_PROCESS_ID, or by an srun /
    mpirun launch of several tasks. Otherwise it does nothing, so a plain run never
    waits for a coordinator. Must run before anything asks JAX for its devices.
    """
    env = os.environ
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    asked = (coordinator, num_processes, process_id) != (None, None, None)
    if not asked and not _cluster_launch():
        return False
    if asked and not _cluster_launch() and None in (coordinator, num_processes, process_id):
        raise UserError("a multi-process run needs --coordinator HOST:PORT, --num-processes N and --process-id I "
                        f"(or ${ENV_COORDINATOR}, ${ENV_NUM_PROCESSES}, ${ENV_PROCESS_ID})")
    if coordinator is not None and not re.fullmatch(r"\[?[\w.:-]+\]?:\d+", coordinator):
        raise UserError(f"--coordinator {coordinator!r}: expected HOST:PORT")
    if num_processes is not None and num_processes < 1:
        raise UserError(f"--num-processes must be at least 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise UserError(f"--process-id {process_id}: expected 0 to {num_processes - 1}")
    timeout = int(env.get("FLAXPORT_JOIN_TIMEOUT", "300"))
    if coordinator is not None and process_id is not None:
        _check_coordinator(coordinator, process_id, timeout)
    import jax

    # Cross-process collectives on CPU: gloo over TCP (JAX's default today; set here so a
    # CPU cluster keeps working if the default moves). A user's own choice wins.
    if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in env:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        # All three given: no cluster detection, which would also pin each process to
        # the one GPU of its SLURM_LOCALID (right for one task per GPU, wrong for one per node).
        explicit = None not in (coordinator, num_processes, process_id)
        jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=timeout,
                                   cluster_detection_method="deactivate" if explicit else None)
    except Exception as e:  # noqa: BLE001 - connection refused, timeout, already initialised ...
        where = coordinator or "(detected)"
        raise UserError(f"cannot join the multi-process run at {where}: {first_line(e, 300)}") from e
    return True


def _check_coordinator(coordinator: str, process_id: int, timeout: float) -> None:
    """Fail with one line where JAX would abort the process (its coordination client
    terminates on a deadline): process 0 needs its port free, the others need to reach it.
    A peer that never starts still ends in JAX's own fatal error after the timeout."""
    import socket

    host, port = coordinator.rsplit(":", 1)
    host = host.strip("[]")
    if process_id == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
            try:
                s.bind(("", int(port)))
            except OSError as e:
                raise UserError(f"--coordinator {coordinator}: process 0 cannot listen on port {port}: "
                                f"{e.strerror or e}") from e
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise UserError(f"cannot reach the coordinator {coordinator} within {timeout:.0f} s "
                                f"({e.strerror or e}); is process 0 running there?") from e
            time.sleep(0.5)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"${name}={raw!r} is not an integer") from None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run's arrays live. mesh None: one device, arrays left as they are."""

    mesh: object = None  # jax.sharding.Mesh over (devices,) along DATA, or None
    devices: int = 1
    processes: int = 1
    process_index: int = 0

    @classmethod
    def single(cls) -> "Placement":
        return cls()

    @property
    def is_main(self) -> bool:
        """Process 0 writes metrics.jsonl, config.json and pictures."""
        return self.process_index == 0

    @property
    def multi_process(self) -> bool:
        return self.processes > 1

    def replicated(self):
        """NamedSharding of arrays copied on every mesh device (None without a mesh)."""
        if self.mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(self.mesh, PartitionSpec())

    def batch_sharding(self):
        """NamedSharding of an epoch's batches (steps, batch, ...): `batch` split along DATA."""
        if self.mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(self.mesh, PartitionSpec(None, DATA))

    def jit_kwargs(self) -> dict:
        """out_shardings for a step/epoch function: everything it returns is replicated."""
        return {} if self.mesh is None else {"out_shardings": self.replicated()}

    def replicate(self, tree):
        """A pytree (arrays, typed keys, Python scalars) copied onto every mesh device.

        Across processes a committed array cannot be moved to devices it does not live
        on, so the values go through the host: every process holds the same ones.
        """
        if self.mesh is None:
            return tree
        import jax

        sharding = self.replicated()

        def put(x):
            if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                return jax.random.wrap_key_data(put(jax.random.key_data(x)), impl=jax.random.key_impl(x))
            return jax.device_put(np.asarray(x) if self.multi_process else x, sharding)

        return jax.tree_util.tree_map(put, tree)

    def scalar(self, value: int):
        """An int32 scalar argument (epoch, step counter) placed like the state."""
        import jax.numpy as jnp

        if self.mesh is None:
            return jnp.int32(value)
        import jax

        return jax.device_put(np.int32(value), self.replicated())

    def zeros(self, shape, dtype):
        import jax
        import jax.numpy as jnp

        if self.mesh is None:
            return jnp.zeros(shape, dtype)
        return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=self.replicated())()

    def local(self, tree):
        """This process's own copy of a replicated tree, on its first device: for evaluation,
        sampling and pictures, which run per process and need no collectives."""
        if self.mesh is None:
            return tree
        import jax

        return jax.tree_util.tree_map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)

    def fetch(self, tree):
        """NumPy copies of a replicated tree (metrics, state for a checksum)."""
        import jax

        return jax.device_get(self.local(tree))


def make_placement(devices: int | None, batch_size: int) -> Placement:
    """The Placement for `devices` devices (default: every visible one, in every process).

    Several processes each give the same number of their own devices, in process order,
    so every process's share of a batch is one contiguous block.
    """
    import jax

    visible = jax.devices()
    procs, me = jax.process_count(), jax.process_index()
    n = len(visible) if devices is None else devices
    if n < 1:
        raise UserError(f"--devices must be at least 1, got {n}")
    if n > len(visible):
        raise UserError(f"--devices {n}: only {len(visible)} {visible[0].platform} device(s) visible")
    if n % procs:
        raise UserError(f"--devices {n} is not a multiple of the {procs} processes")
    if batch_size % n:
        raise UserError(f"batch size {batch_size} is not divisible by {n} devices; "
                        f"choose --devices or --set batch_size=<a multiple of {n}>")
    if n == 1 and procs == 1:
        return Placement.single()
    per = n // procs
    chosen = [d for p in range(procs) for d in [d for d in visible if d.process_index == p][:per]]
    if len(chosen) != n:
        raise UserError(f"--devices {n}: every process needs {per} device(s); some have fewer")
    from jax.sharding import AxisType, Mesh

    # Auto axes: jit propagates the shardings (GSPMD), as the training steps expect.
    mesh = Mesh(np.array(chosen), (DATA,), axis_types=(AxisType.Auto,))
    return Placement(mesh, n, procs, me)


class ShareFeed:
    """Multi-process batches: each process puts only its rows of every global batch on
    its devices, and the epoch's global (steps, batch, ...) array is built from those shares.

    The epoch's permutation is the one `epoch.epoch_batches` draws (same key, same
    function), computed by each process on its own first device: a run over P processes
    sees exactly the batches of a one-process run.
    """

    def __init__(self, data: dict, batch_size: int, steps: int, placement: Placement, data_key):
        import jax

        from flaxport.harness import rng

        self.data = {k: np.asarray(v) for k, v in data.items()}
        self.batch_size, self.steps, self.sharding = batch_size, steps, placement.batch_sharding()
        n = len(next(iter(self.data.values())))
        local_key = placement.local(data_key)
        self._perm = jax.jit(lambda epoch: jax.random.permutation(rng.at(local_key, epoch), n))

    def spec(self) -> dict:
        """Shapes (and shardings) of `inputs`, for ahead-of-time compilation."""
        import jax

        return {k: jax.ShapeDtypeStruct((self.steps, self.batch_size) + a.shape[1:], a.dtype, sharding=self.sharding)
                for k, a in self.data.items()}

    def inputs(self, epoch: int) -> dict:
        """{name: global (steps, batch, ...) array}; this process fills only its devices' slices."""
        import jax

        order = np.asarray(self._perm(np.int32(epoch)))[: self.steps * self.batch_size]
        order = order.reshape(self.steps, self.batch_size)

        def build(a):
            # index: the global slices one local device holds: (steps, batch rows, rest...).
            return jax.make_array_from_callback(
                (self.steps, self.batch_size) + a.shape[1:], self.sharding,
                lambda index: a[order[index[0], index[1]]][(slice(None), slice(None)) + tuple(index[2:])])

        return {k: build(a) for k, a in self.data.items()}

    def batches(self, inputs, data_key, epoch):
        """Inside jit: the inputs already are the epoch's batches."""
        return inputs
