"""The JAX side of check_step: a hand-written Linen twin, or a flaxport.translate translation.

Both give check_step the same handful of things: the starting params and the rest of the
variables (BatchNorm statistics, NNX's RNG counters), a jitted train step, and the
conversions between a parameter-shaped tree and torch's {name: array} (for gradients,
parameters, moments, statistics). A Linen twin converts through the port_weights key
map; a translation through its own `state_dict(tree)` (to torch) and `load_state_dict`
(from torch: loaded into its model, read back, and the model restored).
"""
from __future__ import annotations

import numpy as np

from flaxport.port import draws
from flaxport.port.dropout import FlaxMasks


def _jnp_tree(tree):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(jnp.asarray, tree)


def _train_step(loss_of, tx, update_mask, accumulate: int = 1):
    """jit(step(params, rest, opt_state, micro_xs, micro_ys, replayed, rngs) -> (loss, grads, params, rest,
    opt_state)): one forward and backward of loss / accumulate per micro-batch (the statistics in `rest`
    updated by each), the gradients summed, one optimizer step. replayed: per micro-batch,
    {"dropout": torch's masks, "draws": torch's random draws} (flaxport.port.draws)."""
    import jax
    import optax

    def micro_loss(params, rest, xs, ys, replayed, rngs):
        loss, new_rest = loss_of(params, rest, xs, ys, replayed, rngs)
        return (loss / accumulate if accumulate > 1 else loss), new_rest

    def step(params, rest, opt_state, micro_xs, micro_ys, replayed, rngs):
        loss, grads = 0.0, None
        for xs, ys, rep in zip(micro_xs, micro_ys, replayed):
            (part, rest), g = jax.value_and_grad(micro_loss, has_aux=True)(params, rest, xs, ys, rep, rngs)
            loss = loss + part
            grads = g if grads is None else jax.tree.map(lambda a, b: a + b, grads, g)
        new_rest = rest
        updates, opt_state = tx.update(grads, opt_state, params)
        if update_mask is not None:  # parameters the torch optimizer does not update
            updates = jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, update_mask)
        return loss, grads, optax.apply_updates(params, updates), new_rest, opt_state

    return jax.jit(step)


def _flax_inputs(inputs, channels_first):
    import jax

    from flaxport.port.weights import to_flax_input

    out = []
    for x in inputs:
        a = to_flax_input(x, channels_first)
        if np.issubdtype(a.dtype, np.integer) and not jax.config.jax_enable_x64:
            a = a.astype(np.int32)
        out.append(a)
    return out


class LinenSide:
    """A Linen twin; variables from the key map (or given); inputs channels-last where port_weights says."""

    def __init__(self, module, tm, inputs, train, variables, flatten_shapes, key_map, input_layout, flax_kwargs,
                 torch_kwargs):
        import jax

        from flaxport.port.weights import build_key_map, mode_kwargs, split_rngs

        self.module, self.train = module, train
        self.km = key_map or build_key_map(tm, module, inputs, flatten_shapes=flatten_shapes,
                                           input_layout=input_layout, flax_kwargs=flax_kwargs,
                                           torch_kwargs=torch_kwargs)
        self.cf = self.km.input_channels_first
        variables = variables if variables is not None else self.km.to_flax(tm.state_dict())
        self.params = _jnp_tree(variables["params"])
        self.rest = _jnp_tree({k: v for k, v in variables.items() if k != "params"})
        self.kwargs, self.rngs = split_rngs({**mode_kwargs(module, train), **(flax_kwargs or {})},
                                            jax.random.key(0))
        self.rngs.pop("params")
        self.stat_keys = {leaf.torch_key for leaf in self.km.leaves if leaf.flax_path[0] == "batch_stats"}
        self.flax_names = {leaf.torch_key: leaf.flax_name for leaf in self.km.leaves}
        self.param_names = [n for n, _ in tm.named_parameters()]

    def inputs(self, inputs):
        return _flax_inputs(inputs, self.cf)

    def params_from_torch(self, tensors):
        return _jnp_tree(self.km.params_to_flax(tensors))

    def params_to_torch(self, tree) -> dict:
        return self.km.to_torch({"params": tree})

    def stats_to_torch(self, params, rest) -> dict:
        if "batch_stats" not in rest:
            return {}
        return self.km.to_torch({"params": params, "batch_stats": rest["batch_stats"]})

    def step_fn(self, loss_fn, tx, frozen, dropout_mode, accumulate: int = 1):
        import jax.numpy as jnp

        module, kwargs, cf = self.module, self.kwargs, self.cf
        mutable = ["batch_stats"] if self.train and "batch_stats" in self.rest else False

        def loss_of(params, rest, xs, ys, replayed, rngs):
            fm = FlaxMasks(replayed["dropout"], dropout_mode, cf)
            with fm.linen(), draws.jax_replay(replayed["draws"]):
                res = module.apply({"params": params, **rest}, *xs, **kwargs, mutable=mutable, rngs=dict(rngs))
            fm.finish()
            out, new = res if mutable else (res, {})
            if cf:  # the torch loss reads torch's layout: channels back to axis 1
                import jax

                out = jax.tree.map(lambda o: jnp.moveaxis(o, -1, 1) if 3 <= o.ndim <= 5 else o, out)
            return loss_fn(out, ys), {**rest, **new}

        return _train_step(loss_of, tx, self._update_mask(frozen), accumulate)

    def _update_mask(self, frozen):
        if not frozen:
            return None
        shapes = {leaf.torch_key: leaf for leaf in self.km.leaves}
        ones = {}
        for n in self.param_names:
            leaf = shapes[n]
            shape = self.km.flax_shapes[leaf.flax_path]
            ones[n] = leaf.convert.to_torch(np.full(shape, 0.0 if n in frozen else 1.0))
        return self.params_from_torch(ones)

    def restore(self):
        pass


class NNXSide:
    """A translation (flaxport.translate): its model, switched to train/eval on a copy, weights from torch."""

    def __init__(self, translation, tm, train, float64):
        import jax
        from flax import nnx

        self.t = translation
        self.snapshot = _copy_state(translation.model)
        self.param_names = [n for n, _ in tm.named_parameters()]
        sd = tm.state_dict()
        every_param_name = {n for n, _ in tm.named_parameters(remove_duplicate=False)}  # a tied weight's other names
        self.stat_keys = {k for k in sd if k not in every_param_name}
        if float64:  # first, so that load_state_dict keeps torch's float64 weights whole
            nnx.update(translation.model, jax.tree.map(_float64, nnx.state(translation.model)))
        # Clones: JAX may alias a NumPy view of a torch tensor on CPU, and torch's steps write in place.
        translation.load_state_dict({k: v.detach().clone() for k, v in sd.items()})
        graphdef, state = nnx.split(translation.model)
        model = nnx.merge(graphdef, state)  # a second module over the same arrays: its mode changes, not t.model's
        model.train() if train else model.eval()
        self.graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.params, self.rest = jax.tree.map(lambda a: a, params), jax.tree.map(lambda a: a, rest)  # detached
        self.rngs = {}
        self.flax_names = self._names()

    def _names(self) -> dict:
        """{torch key: NNX path} by converting a tree whose i-th parameter is filled with i."""
        import jax
        import jax.numpy as jnp

        leaves = jax.tree_util.tree_leaves_with_path(self.params)
        probe = jax.tree_util.tree_unflatten(jax.tree.structure(self.params),
                                             [jnp.full(v.shape, i, v.dtype) for i, (_, v) in enumerate(leaves)])
        try:
            sd = self.t.state_dict(probe)
        except Exception:  # names are only for the report
            return {}
        out = {}
        for k, v in sd.items():
            a = np.asarray(v)
            if a.size:
                i = int(a.flat[0])
                if 0 <= i < len(leaves):
                    out[k] = "/".join(str(p.key) for p in leaves[i][0] if hasattr(p, "key"))
        return out

    def inputs(self, inputs):
        return _flax_inputs(inputs, False)

    def params_from_torch(self, tensors):
        import jax
        import torch
        from flax import nnx

        saved = _copy_state(self.t.model)
        try:
            full = {k: np.asarray(v) for k, v in self.t.state_dict().items()}
            full.update({k: np.asarray(v) for k, v in tensors.items()})
            self.t.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in full.items()})
            tree = _copy_state(self.t.model, nnx.Param)  # a copy: the model is restored below
        finally:
            nnx.update(self.t.model, saved)
        return jax.tree.map(lambda new, old: new.astype(old.dtype), tree, self.params)

    def params_to_torch(self, tree) -> dict:
        sd = self.t.state_dict(tree)
        return {k: np.asarray(v) for k, v in sd.items() if k in set(self.param_names)}

    def stats_to_torch(self, params, rest) -> dict:
        from flax import nnx

        saved = _copy_state(self.t.model)
        try:
            nnx.update(self.t.model, rest)
            sd = self.t.state_dict()
        finally:
            nnx.update(self.t.model, saved)
        return {k: np.asarray(v) for k, v in sd.items() if k in self.stat_keys}

    def step_fn(self, loss_fn, tx, frozen, dropout_mode, accumulate: int = 1):
        from flax import nnx

        graphdef = self.graphdef
        # the translation's RNN layers (torch's between-layer dropout is off: silence_recurrent_dropout)
        recurrent = [c for c in getattr(self.t, "namespace", {}).values()
                     if isinstance(c, type) and any(b.__name__ == "_RNNBase" for b in c.__mro__)]

        def loss_of(params, rest, xs, ys, replayed, rngs):
            import jax

            # Fresh Variables at this trace level (unflattening makes new ones): NNX refuses to mutate
            # BatchNorm statistics created at the outer (jit) level from inside the gradient's trace.
            model = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest))
            fm = FlaxMasks(replayed["dropout"], dropout_mode, False)
            with fm.nnx(recurrent), draws.jax_replay(replayed["draws"]):
                out = model(*xs)
            fm.finish()
            _, _, new_rest = nnx.split(model, nnx.Param, ...)
            return loss_fn(out, ys), new_rest

        mask = None
        if frozen:
            mask = self.params_from_torch({n: np.full(np.shape(self.params_to_torch(self.params)[n]),
                                                      0.0 if n in frozen else 1.0) for n in self.param_names})
        return _train_step(loss_of, tx, mask, accumulate)

    def restore(self):
        from flax import nnx

        nnx.update(self.t.model, self.snapshot)


def _copy_state(model, *filters):
    """The model's variables as they are now: nnx.state holds the live Variables, so rebuild them."""
    import jax
    from flax import nnx

    return jax.tree.map(lambda a: a, nnx.state(model, *filters))


def _float64(a):
    import jax.numpy as jnp

    return a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a


def linen_side(*args):
    return LinenSide(*args)


def nnx_side(translation, tm, train, float64):
    return NNXSide(translation, tm, train, float64)
