"""flaxport: move PyTorch training code to JAX/Flax and prove the port is exact.

Importing flaxport imports neither torch nor keras (nor jax): twins load them lazily.
"""
__version__ = "0.1.0"
