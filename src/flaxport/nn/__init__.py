"""Flax layers that reproduce torch.nn layers exactly (names, init, numerics)."""
from flaxport.nn.batchnorm import BatchNorm
from flaxport.nn.linear import Dense, torch_bias_init, torch_kernel_init

__all__ = ["BatchNorm", "Dense", "torch_bias_init", "torch_kernel_init"]
