"""Score a DDIM run's EMA network and its trained ("online") network alike.

    python -m flaxport.cli.ema_check --workdir DIR [--data-dir D]

Reads the newest checkpoint of a jax or torch run and evaluates it twice, once per
`sample_weights` ("ema", "online": the trained weights with their running BN statistics),
on the same fixed noise; prints one JSON line {"workdir", "framework", "epochs_done",
"ema": quality, "online": quality}. Sampling uses the EMA weights because they should be
at least as good: this says whether they are.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys


def check(workdir, data_dir=None) -> dict:
    """{'workdir', 'framework', 'epochs_done', 'ema': quality, 'online': quality}."""
    from flaxport.cli.evaluate import restore

    workload, config, info, framework, state, _ = restore("ddim", workdir)
    evaluate = workload.evaluate if framework == "jax" else importlib.import_module(workload.torch_twin).evaluate
    data = workload.load_data(config, config.data, data_dir)
    out = {"workdir": str(workdir), "framework": framework, "epochs_done": info.get("epochs_done")}
    for weights in ("ema", "online"):
        out[weights], _ = evaluate(dataclasses.replace(config, sample_weights=weights), state, data, None)
    return out


def main(argv=None) -> int:
    from flaxport.errors import UserError

    parser = argparse.ArgumentParser(prog="python -m flaxport.cli.ema_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data-dir", default=None, help="where real datasets live (default $FLAXPORT_DATA)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(check(args.workdir, args.data_dir)))
    except UserError as e:
        print(f"flaxport: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
