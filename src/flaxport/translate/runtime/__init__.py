"""The torch-faithful JAX code a generated model file carries: layers and functions.

Real, tested modules; the emitter copies the source of the pieces a model uses into the
generated file, which imports only jax, flax, numpy and the standard library. native.py
holds what the default `--conv native` puts in place of functions.py's convolution.
"""
