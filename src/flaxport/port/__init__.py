"""Generic porting of any torch module to a hand-written Flax twin, and proof that it is exact.

  port_weights(torch_module, flax_module, example_input, *, flatten_shapes=None) -> variables
  to_torch_state_dict(variables, torch_module, flax_module, example_input, ...) -> state_dict
  check_parity(torch_module, flax_module, variables, inputs, train=False, loss_fn=None, ...) -> ParityReport
  check_step(torch_module, torch_optimizer, loss_fn, flax_model_or_translation, batch, steps=3) -> StepReport
  optax_from_torch(torch_optimizer or spec, scheduler=None) -> optax.GradientTransformation
  register_converter(torch_type, fn) -> teach the key map a layer type (Slot says where a tensor goes)
  init_state_from_torch(workload, config, path, key) -> a workload's Flax train state from a torch file
  translate(torch_module, *example_inputs) -> Translation: Flax NNX source, weights, proof (flaxport.translate)

Importing this package imports neither torch nor (beyond optax/numpy) any framework;
the functions import torch when they receive torch objects.
"""
from flaxport.port.checkpoints import init_state_from_torch
from flaxport.port.converters import DROP, Slot, register_converter, unregister_converter
from flaxport.port.losses import UnsupportedLossError
from flaxport.port.optim import UnsupportedOptimizerError, optax_from_torch, optax_state_from_torch, spec_from_torch
from flaxport.port.parity import ParityReport, Row, check_parity
from flaxport.port.schedules import UnsupportedSchedulerError
from flaxport.port.step import StepReport, check_step
from flaxport.port.weights import (KeyMap, MissingKeyError, PortError, ShapeMismatchError, UnexpectedKeyError,
                                   UnsupportedLayerError, build_key_map, port_weights, to_torch_state_dict)

def translate(module, *example_args, **example_kwargs):
    """flaxport.translate.translate: a torch.nn.Module as Flax NNX source, with its weights and proof."""
    from flaxport.translate import translate as _translate

    return _translate(module, *example_args, **example_kwargs)


__all__ = ["DROP", "KeyMap", "MissingKeyError", "ParityReport", "PortError", "Row", "ShapeMismatchError", "Slot",
           "StepReport", "UnexpectedKeyError", "UnsupportedLayerError", "UnsupportedLossError",
           "UnsupportedOptimizerError", "UnsupportedSchedulerError", "build_key_map", "check_parity", "check_step",
           "init_state_from_torch", "optax_from_torch", "optax_state_from_torch", "port_weights",
           "register_converter", "spec_from_torch", "to_torch_state_dict", "translate", "unregister_converter"]
