"""Generic porting of any torch module to a hand-written Flax twin, and proof that it is exact.

  port_weights(torch_module, flax_module, example_input, *, flatten_shapes=None) -> variables
  to_torch_state_dict(variables, torch_module, flax_module, example_input, ...) -> state_dict
  check_parity(torch_module, flax_module, variables, inputs, train=False, loss_fn=None, ...) -> ParityReport
  check_step(torch_module, torch_optimizer, loss_fn, flax_model_or_translation, batch, steps=3) -> StepReport
  optax_from_torch(torch_optimizer or spec, scheduler=None) -> optax.GradientTransformation
  register_converter(torch_type, fn) -> teach the key map a layer type (Slot says where a tensor goes)

A torch module without a hand-written twin: flaxport.translate. A registered workload's Flax
train state from a torch file: flaxport.workloads.checkpoints.init_state_from_torch.

Importing this package imports neither torch nor (beyond optax/numpy) any framework;
the functions import torch when they receive torch objects.
"""
from flaxport.port.converters import DROP, Slot, register_converter, unregister_converter
from flaxport.port.losses import UnsupportedLossError
from flaxport.port.optim import UnsupportedOptimizerError, optax_from_torch, optax_state_from_torch, spec_from_torch
from flaxport.port.parity import ParityReport, Row, check_parity
from flaxport.port.schedules import UnsupportedSchedulerError
from flaxport.port.step import StepReport, check_step
from flaxport.port.weights import (KeyMap, MissingKeyError, PortError, ShapeMismatchError, UnexpectedKeyError,
                                   UnsupportedLayerError, build_key_map, port_weights, to_torch_state_dict)

__all__ = ["DROP", "KeyMap", "MissingKeyError", "ParityReport", "PortError", "Row", "ShapeMismatchError", "Slot",
           "StepReport", "UnexpectedKeyError", "UnsupportedLayerError", "UnsupportedLossError",
           "UnsupportedOptimizerError", "UnsupportedSchedulerError", "build_key_map", "check_parity", "check_step",
           "optax_from_torch", "optax_state_from_torch", "port_weights",
           "register_converter", "spec_from_torch", "to_torch_state_dict", "unregister_converter"]
