"""flaxport env: versions, devices, thread settings."""
from __future__ import annotations

from flaxport.machine import facts, package_version


def add_parser(sub):
    p = sub.add_parser("env", help="print versions and devices")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--gemm", nargs="?", const="1024,1024,1024", default=None, metavar="M,K,N",
                   help="also measure float32 matmul GFLOP/s of (M,K)@(K,N) in XLA and torch: "
                        "the ceiling a compute-bound step can reach here")
    p.set_defaults(run=run)


def gemm_gflops(m: int, k: int, n: int, seconds: float = 1.0) -> dict:
    """{'jax': GFLOP/s, 'torch': GFLOP/s} of a float32 (m, k) @ (k, n), best of 5 timed
    windows of ~seconds/5 each after a warm-up; every thread each framework uses."""
    import time

    import jax
    import numpy as np

    from flaxport.errors import UserError

    if min(m, k, n) < 1:
        raise UserError(f"--gemm sizes must be positive, got {m},{k},{n}")
    rng = np.random.default_rng(0)
    a, b = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
    flop = 2.0 * m * k * n

    def best(call, sync):
        sync(call())
        t0, reps = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.05:  # calibrate: calls per window
            sync(call())
            reps += 1
        rates = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(max(1, int(reps * seconds / 5 / 0.05))):
                r = call()
            sync(r)
            rates.append(max(1, int(reps * seconds / 5 / 0.05)) * flop / (time.perf_counter() - t) / 1e9)
        return float(f"{max(rates):.3g}")  # 3 significant digits: tiny test shapes run at < 0.1

    ja, jb = jax.device_put(a), jax.device_put(b)
    f = jax.jit(lambda x, y: x @ y)
    out = {"jax": best(lambda: f(ja, jb), lambda r: r.block_until_ready())}
    if package_version("torch") != "not installed":
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch"] = best(lambda: ta @ tb, lambda r: None)
    return out


def run(args) -> int:
    for k, v in facts().items():
        print(f"{k:18s} {v}")
    if args.gemm:
        from flaxport.errors import UserError

        try:
            m, k, n = (int(x) for x in args.gemm.split(","))
        except ValueError:
            raise UserError(f"--gemm expects M,K,N integers, got {args.gemm!r}") from None
        for fw, rate in gemm_gflops(m, k, n).items():
            print(f"{'gemm_' + fw:18s} {rate} GFLOP/s float32 ({m},{k})@({k},{n})")
    return 0
