"""Explicit randomness: one root seed, named streams, per-step keys by fold_in.

A key depends only on (seed, stream name, counter), never on how many keys were drawn
before, so a resumed run and an uninterrupted one draw the same numbers.
"""
from __future__ import annotations

import zlib

import jax


def stream(seed: int, name: str) -> jax.Array:
    """The key of stream `name` under root `seed` (a typed PRNG key, shape ())."""
    root = jax.random.key(seed)
    return jax.random.fold_in(root, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def streams(seed: int, names=("init", "data", "train", "eval")) -> dict:
    """{name: key} for each named stream."""
    return {name: stream(seed, name) for name in names}


def at(key: jax.Array, counter) -> jax.Array:
    """The key for step/epoch `counter` of a stream (counter may be traced)."""
    return jax.random.fold_in(key, counter)

