"""Flax layers that reproduce torch.nn layers exactly (names, init, numerics)."""
from flaxport.nn.activation import GELU, gelu
from flaxport.nn.batchnorm import BatchNorm
from flaxport.nn.conv import Conv2d, conv2d, max_pool2d
from flaxport.nn.conv_nd import Conv1d, Conv3d, ConvNd
from flaxport.nn.conv_transpose import (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, ConvTransposeNd,
                                        conv_transpose)
from flaxport.nn.linear import Dense, torch_bias_init, torch_kernel_init
from flaxport.nn.norm import GroupNorm, LayerNorm
from flaxport.nn.pool import AvgPool, MaxPool, avg_pool, max_pool
from flaxport.nn.recurrent import GRU, LSTM

__all__ = ["AvgPool", "BatchNorm", "Conv1d", "Conv2d", "Conv3d", "ConvNd", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "ConvTransposeNd", "Dense", "GELU", "GRU", "GroupNorm", "LSTM", "LayerNorm", "MaxPool",
           "avg_pool", "conv2d", "conv_transpose", "gelu", "max_pool", "max_pool2d", "torch_bias_init",
           "torch_kernel_init"]
