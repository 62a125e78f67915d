"""Translate a torch.nn.Module into readable Flax NNX source, with its weights and the proof.

  translate(torch_module, *example_inputs, **example_kwargs) -> Translation
      .source   the generated model.py (imports only jax, flax, numpy, stdlib, and flaxport's
                CPU conv kernels where flaxport is installed, unless conv="xla")
      .model    an nnx.Module with the torch weights, in the torch module's train/eval mode
      .report   the proof: float64 per submodule boundary, float32 beside (a ParityReport)
      .state_dict(tree=None)       NNX variables (or a tree shaped like them: gradients,
                                   optimizer moments) -> {torch name: NumPy}, torch's layouts
      .load_state_dict(state_dict) torch names -> NNX variables (NumPy or tensors)
      .new_model(dtype=None, seed=0) a fresh copy (jnp.float64 under jax.enable_x64(True))
      .save(directory)             model.py, weights.safetensors, parity.md
  proof.check_train(t, torch_module) -> ParityReport: one train-mode forward against torch
      (dropout off on both sides): outputs, BatchNorm running statistics and counters
  written.check_written(t, torch_module, directory) -> WrittenCheck: the files t.save(directory)
      wrote, loaded with model.py's load() and run jitted, in eval mode against torch's float32
      outputs and in train mode (what `flaxport translate` runs last)
  translate_function(fn, *example_args, **example_kwargs) -> a function on JAX arrays
      (e.g. a loss: translate_function(F.cross_entropy, logits, targets))
  write_train_step(t, torch_module, optimizer, loss) -> TrainStep: train_step.py's source
      (the optimizer as optax, the loss in JAX, a jitted step) and its proof; t.save writes it

The stages, each a module here, each reading what the one before produced
(docs/architecture.md has the whole picture):

  preflight  the forward runs once on the example inputs
  capture    torch.export in eval, train and float64 -> Capture (graph cut into module calls;
             marks tags the calls of layers written as the user called them)
  plan       Plan (never changed once made): what each torch module becomes, each call's
             inputs, outputs and sizes
  dataflow   how values flow in one call: units, readers, what is inlined, where sizes come from
  body       one call's __call__ -> Body (its lines, the runtime pieces it asked for, its problems)
  classes    bodies merged over modes and calls, instances grouped -> Classes (frozen; with the
             plan revised where rendering decides a module's kind)
  emit       Classes' plan + Classes -> the model.py text
  proof      the translation against torch, float64 at every module boundary
  written    the files as saved, loaded with model.py's load() and run in eval and train mode

Importing this package imports neither torch nor JAX; the functions do.
"""
from flaxport.translate.errors import ExportError, TranslateError, UnsupportedOpsError


def translate(module, *example_args, **example_kwargs):
    from flaxport.translate.translation import translate as _translate

    return _translate(module, *example_args, **example_kwargs)


translate.__doc__ = """Translate a torch.nn.Module into Flax NNX source (see flaxport.translate.translation.translate)."""


def translate_function(fn, *example_args, **example_kwargs):
    from flaxport.translate.function import translate_function as _tf

    return _tf(fn, *example_args, **example_kwargs)


def write_train_step(t, module, optimizer, loss, batch=None, check=True):
    from flaxport.translate.train_step import write_train_step as _wts

    return _wts(t, module, optimizer, loss, batch=batch, check=check)


write_train_step.__doc__ = """train_step.py for a translation (see flaxport.translate.train_step.write_train_step)."""

__all__ = ["ExportError", "TranslateError", "UnsupportedOpsError", "translate", "translate_function",
           "write_train_step"]
