"""K VAE members as one PyTorch program: step_torch.step through torch.func.vmap.

The members' models are stacked with `torch.func.stack_module_state`; the loss gradient
is `vmap(grad(loss))` over `functional_call`, then one fused Adam step on the stacked
tensors (Adam is elementwise, so one optimizer over (K, ...) tensors is K independent ones).
"""
from __future__ import annotations

from torch.func import functional_call, grad, vmap

from flaxport.workloads.vae.step_torch import final_loss, flatten

MODULES = ("model",)
OPTIMIZERS = {"opt": "model"}


def noise_shape(config) -> tuple:
    """Each member's noise of one step: eps (batch, latents), as step_torch.train_step draws it."""
    return (config.batch_size, config.latents)


def make_train_step(config, models: dict):
    """train_step(state {'model': (params, buffers)} stacked, opts {'opt': optimizer}, batch
    {'image': (K, B, H, W, 1) uint8}, eps (K, B, latents)) -> {'loss', 'bce', 'kl'}: (K,) tensors."""
    net = models["model"]

    def loss_fn(params, buffers, images, eps):
        x = flatten(images)
        logits, mean, logvar = functional_call(net, (params, buffers), (x, eps))
        loss, bce, kl = final_loss(logits, x, mean, logvar)
        return loss, (loss, bce, kl)

    member_grad = vmap(grad(loss_fn, has_aux=True))

    def train_step(state, opts, batch, eps):
        params, buffers = state["model"]
        grads, (loss, bce, kl) = member_grad(params, buffers, batch["image"], eps)
        for name, p in params.items():
            p.grad = grads[name]
        opts["opt"].step()
        return {"loss": loss.detach(), "bce": bce.detach(), "kl": kl.detach()}

    return train_step
