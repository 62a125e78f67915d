"""Flax layers that reproduce torch.nn layers exactly (names, init, numerics)."""
from flaxport.nn.batchnorm import BatchNorm
from flaxport.nn.conv import Conv2d, conv2d, max_pool2d
from flaxport.nn.linear import Dense, torch_bias_init, torch_kernel_init

__all__ = ["BatchNorm", "Conv2d", "Dense", "conv2d", "max_pool2d", "torch_bias_init", "torch_kernel_init"]
