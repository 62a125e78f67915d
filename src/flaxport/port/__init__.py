"""Generic porting of any torch module to a hand-written Flax twin, and proof that it is exact.

  port_weights(torch_module, flax_module, example_input, *, flatten_shapes=None) -> variables
  to_torch_state_dict(variables, torch_module, flax_module, example_input, ...) -> state_dict
  check_parity(torch_module, flax_module, variables, inputs, train=False, loss_fn=None, ...) -> ParityReport
  optax_from_torch(torch_optimizer or spec) -> optax.GradientTransformation
  init_state_from_torch(workload, config, path, key) -> a workload's Flax train state from a torch file
  translate(torch_module, *example_inputs) -> Translation: Flax NNX source, weights, proof (flaxport.translate)

Importing this package imports neither torch nor (beyond optax/numpy) any framework;
the functions import torch when they receive torch objects.
"""
from flaxport.port.checkpoints import init_state_from_torch
from flaxport.port.optim import UnsupportedOptimizerError, optax_from_torch, spec_from_torch
from flaxport.port.parity import ParityReport, Row, check_parity
from flaxport.port.weights import (KeyMap, MissingKeyError, PortError, ShapeMismatchError, UnexpectedKeyError,
                                   UnsupportedLayerError, build_key_map, port_weights, to_torch_state_dict)

def translate(module, *example_args, **example_kwargs):
    """flaxport.translate.translate: a torch.nn.Module as Flax NNX source, with its weights and proof."""
    from flaxport.translate import translate as _translate

    return _translate(module, *example_args, **example_kwargs)


__all__ = ["KeyMap", "MissingKeyError", "ParityReport", "PortError", "Row", "ShapeMismatchError",
           "UnexpectedKeyError", "UnsupportedLayerError", "UnsupportedOptimizerError", "build_key_map",
           "check_parity", "init_state_from_torch", "optax_from_torch", "port_weights", "spec_from_torch",
           "to_torch_state_dict", "translate"]
