"""K GAN members as one PyTorch program: step_torch.train_step through torch.func.vmap.

The members' G and D are stacked with `torch.func.stack_module_state`; each of the
step's three updates (G, D on real, D on fake) is `vmap(grad(loss))` over
`functional_call`, then one fused Adam step on the stacked tensors (Adam is elementwise,
so one optimizer over (K, ...) tensors is K independent ones). BatchNorm's running
statistics are stacked buffers, updated in place per member as in the single run.
"""
from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

MODULES = ("G", "D")
OPTIMIZERS = {"g_opt": "G", "d_opt": "D"}


def noise_shape(config) -> tuple:
    """Each member's noise of one step: z (batch, z_dim), as step_torch.train_step draws it."""
    return (config.batch_size, config.z_dim)


def _mse(pred, target: float):
    return torch.mean(torch.square(pred - target))


def make_train_step(config, models: dict):
    """train_step(state {module: (params, buffers)} stacked, opts {name: optimizer}, batch
    {'x': (K, B, 1)}, z (K, B, z_dim)) -> {'g_loss', 'd_loss'}: (K,) tensors."""
    G, D = models["G"], models["D"]

    def g_loss(gp, gb, dp, db, z):
        fake = functional_call(G, (gp, gb), (z,))
        loss = _mse(functional_call(D, (dp, db), (fake,)), 1.0)
        return loss, (loss, fake)

    def d_loss(dp, db, x, target):
        loss = _mse(functional_call(D, (dp, db), (x,)), target)
        return loss, loss

    g_grad = vmap(grad(g_loss, has_aux=True))
    d_grad = vmap(grad(d_loss, has_aux=True), in_dims=(0, 0, 0, None))

    def apply(opt, params: dict, grads: dict):
        for name, p in params.items():
            p.grad = grads[name]
        opt.step()

    def train_step(state, opts, batch, z):
        (gp, gb), (dp, db) = state["G"], state["D"]
        grads, (loss_g, fake) = g_grad(gp, gb, dp, db, z)
        apply(opts["g_opt"], gp, grads)
        grads, loss_real = d_grad(dp, db, batch["x"], 1.0)
        apply(opts["d_opt"], dp, grads)
        grads, loss_fake = d_grad(dp, db, fake.detach(), 0.0)
        apply(opts["d_opt"], dp, grads)
        return {"g_loss": loss_g.detach(), "d_loss": ((loss_real + loss_fake) / 2.0).detach()}

    return train_step
