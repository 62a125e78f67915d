"""Each torch.optim optimizer as the optax chain that takes its steps: one list of links that
is both built here (for check_step) and written out as train_step.py's make_optimizer.

The order of a chain is torch's order of operations: maximize negates the gradient first,
L2 weight decay (torch's `weight_decay` everywhere but the decoupled optimizers) is added
to it next, then the optimizer's own scaling, decoupled decay from the old parameters,
and the learning rate last. Where torch computes the learning rate into the update
(ASGD, Rprop, Adafactor, Muon) the transformation takes it and the chain ends there.
"""
from __future__ import annotations

import dataclasses

from flaxport.errors import UserError


class UnsupportedOptimizerError(UserError):
    """A torch optimizer or option with no faithful optax translation here."""


TORCH_DEFAULTS = {
    "sgd": dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
    "adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
                 decoupled_weight_decay=False),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, maximize=False,
                  decoupled_weight_decay=True),
    "rmsprop": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False),
    "adagrad": dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                    maximize=False),
    "adadelta": dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False),
    "adamax": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False),
    "nadam": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                  decoupled_weight_decay=False, maximize=False),
    "radam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
                  maximize=False),
    "asgd": dict(lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False),
    "rprop": dict(lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0), maximize=False),
    "adafactor": dict(lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, maximize=False),
    "muon": dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=(3.4445, -4.775, 2.0315),
                 eps=1e-7, ns_steps=5, adjust_lr_fn=None),
}
NAMES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad",
         "adadelta": "Adadelta", "adamax": "Adamax", "nadam": "NAdam", "radam": "RAdam", "asgd": "ASGD",
         "rprop": "Rprop", "adafactor": "Adafactor", "muon": "Muon"}
# The torch optimizers no chain takes the steps of, and why.
REFUSED = {
    "lbfgs": "LBFGS re-evaluates the loss through a closure up to max_iter times a step (with its own line search "
             "and stopping tests), which a train step of one gradient cannot take; the closest optax one is "
             "optax.lbfgs, with another line search",
    "sparseadam": "SparseAdam steps only on sparse gradients (nn.Embedding(sparse=True)), which JAX does not have; "
                  "use Adam, which takes the same steps on the rows a batch touches except for the moments of the "
                  "others",
}
# torch's per-parameter state names -> the optax state field holding each.
MOMENTS = {"sgd": {"momentum_buffer": "trace"},
           "adam": {"exp_avg": "mu", "exp_avg_sq": "nu", "max_exp_avg_sq": "nu_max"},
           "adamw": {"exp_avg": "mu", "exp_avg_sq": "nu", "max_exp_avg_sq": "nu_max"},
           "rmsprop": {"square_avg": "nu", "grad_avg": "mu", "momentum_buffer": "trace"},
           "adagrad": {"sum": "sum"}, "adadelta": {"square_avg": "e_g", "acc_delta": "e_x"},
           "adamax": {"exp_avg": "mu", "exp_inf": "nu"}, "nadam": {"exp_avg": "mu", "exp_avg_sq": "nu"},
           "radam": {"exp_avg": "mu", "exp_avg_sq": "nu"}, "asgd": {"ax": "ax"},
           "rprop": {"prev": "prev", "step_size": "step_size"}, "adafactor": {}, "muon": {"momentum_buffer": "trace"}}
# torch's scalars kept per parameter (the same for all) -> the optax state field.
SCALARS = {"nadam": {"mu_product": "mu_product"}, "asgd": {"eta": "eta", "mu": "mu"}}
# Group entries that choose an implementation, not the arithmetic, and those LR schedulers add.
IGNORED = {"params", "foreach", "fused", "capturable", "differentiable", "name", "initial_lr", "max_lr", "min_lr",
           "max_momentum", "base_momentum", "param_names"}


class Expr(str):
    """A name in the generated code (the learning rate's schedule), written without quotes."""

    def __repr__(self):
        return str(self)


@dataclasses.dataclass(frozen=True)
class Link:
    """One transformation of a chain: `fn(**kwargs)`, and why it is there (a comment)."""

    fn: str  # "optax.scale_by_adam" or a transforms.py function
    kwargs: tuple = ()  # ((name, value), ...)
    why: str = ""
    inject: tuple = ()  # hyperparameters that follow a schedule: optax.inject_hyperparams

    @property
    def code(self) -> str:
        args = ", ".join(f"{k}={_literal(v)}" for k, v in self.kwargs)
        if not self.inject:
            return f"{self.fn}({args})"
        static = tuple(k for k, v in self.kwargs if isinstance(v, bool) or v is None)
        return f"optax.inject_hyperparams({self.fn}, static_args={static!r})({args})"


def _literal(v) -> str:
    if isinstance(v, float) and v == float("inf"):
        return 'float("inf")'
    if isinstance(v, Link):
        return v.code
    if isinstance(v, list):
        return "[" + ", ".join(_literal(e) for e in v) + "]"
    return repr(v)


def defaults(name: str) -> dict:
    if name in REFUSED:
        raise UnsupportedOptimizerError(f"torch.optim.{_display(name)} is not translated: {REFUSED[name]}")
    if name not in TORCH_DEFAULTS:
        raise UnsupportedOptimizerError(f"optimizer {name!r} is not translated (translated: "
                                        f"{', '.join(NAMES[n] for n in TORCH_DEFAULTS)})")
    return TORCH_DEFAULTS[name]


def _display(name: str) -> str:
    return {"lbfgs": "LBFGS", "sparseadam": "SparseAdam"}.get(name, NAMES.get(name, name))


def hyper(name: str, spec: dict) -> dict:
    """torch's defaults filled in under `spec` (unknown options refused)."""
    known = defaults(name)
    if unknown := sorted(set(spec) - set(known) - IGNORED):
        raise UnsupportedOptimizerError(f"{name} option {unknown[0]!r} is not translated")
    return {**known, **{k: v for k, v in spec.items() if k not in IGNORED}}


def _f(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


def links(name: str, h: dict, learning_rate=Expr("learning_rate"), momentum=None) -> list:
    """The chain of torch optimizer `name` (a TORCH_DEFAULTS key) with hyperparameters `h`
    (hyper()'s). learning_rate: a number or an Expr naming its schedule. momentum: an Expr
    naming a schedule of SGD/RMSprop's momentum or Adam's beta1 (OneCycleLR's), or None."""
    chain = []
    if h.get("maximize"):
        chain.append(Link("optax.scale", (("step_size", -1.0),), "maximize=True: torch negates the gradient first"))
    wd = _f(h.get("weight_decay", 0.0))
    decoupled = bool(h.get("decoupled_weight_decay")) or name in ("adafactor", "muon")
    if wd and not decoupled:
        chain.append(Link("optax.add_decayed_weights", (("weight_decay", wd),),
                          "torch's weight_decay here is L2: added to the gradient before anything else"))
    lr_link = Link("optax.scale_by_learning_rate", (("learning_rate", learning_rate),))
    mom = momentum if momentum is not None else None
    if name == "sgd":
        m = _f(h["momentum"])
        if h["nesterov"] and m <= 0 and mom is None:
            raise UnsupportedOptimizerError("SGD nesterov needs momentum > 0 (torch refuses it too)")
        if m or mom is not None:
            if _f(h["dampening"]):
                chain.append(Link("torch_trace", (("decay", mom or m), ("dampening", _f(h["dampening"])),
                                                  ("nesterov", bool(h["nesterov"]))),
                                  "torch's momentum buffer starts at the first gradient, undampened",
                                  inject=("decay",) if mom else ()))
            else:
                chain.append(Link("optax.trace", (("decay", mom or m), ("nesterov", bool(h["nesterov"]))),
                                  "torch's momentum buffer starts at the first gradient: optax.trace",
                                  inject=("decay",) if mom else ()))
        return chain + [lr_link]
    if name == "rmsprop":
        scale = "optax.scale_by_stddev" if h["centered"] else "optax.scale_by_rms"
        chain.append(Link(scale, (("decay", _f(h["alpha"])), ("eps", _f(h["eps"])), ("initial_scale", 0.0),
                                  ("eps_in_sqrt", False)),
                          "torch: eps outside the square root, the mean square starts at 0, alpha is optax's decay"))
        m = _f(h["momentum"])
        if m or mom is not None:
            chain.append(Link("optax.trace", (("decay", mom or m), ("nesterov", False)),
                              "torch's momentum accumulates the unscaled step; the learning rate comes after it",
                              inject=("decay",) if mom else ()))
        return chain + [lr_link]
    if name == "adagrad":
        chain.append(Link("scale_by_torch_adagrad", (("eps", _f(h["eps"])),
                                                     ("initial_accumulator_value", _f(h["initial_accumulator_value"])),
                                                     ("lr_decay", _f(h["lr_decay"]))),
                          "torch: eps outside the square root, the sum starts at initial_accumulator_value"))
        return chain + [lr_link]
    if name == "adadelta":
        chain.append(Link("optax.scale_by_adadelta", (("rho", _f(h["rho"])), ("eps", _f(h["eps"]))),
                          "torch's Adadelta: the same running averages, eps inside both square roots"))
        return chain + [lr_link]
    if name == "asgd":
        chain.append(Link("torch_asgd", (("learning_rate", learning_rate), ("lambd", _f(h["lambd"])),
                                         ("alpha", _f(h["alpha"])), ("t0", _f(h["t0"]))),
                          "torch's ASGD computes the learning rate into its step size eta"))
        return chain
    if name == "rprop":
        (etaminus, etaplus), (smin, smax) = h["etas"], h["step_sizes"]
        chain.append(Link("torch_rprop", (("learning_rate", learning_rate), ("etaminus", _f(etaminus)),
                                          ("etaplus", _f(etaplus)), ("step_size_min", _f(smin)),
                                          ("step_size_max", _f(smax))),
                          "torch's Rprop: step sizes start at the learning rate (read once) and follow the signs"))
        return chain
    if name == "adafactor":
        eps1, eps2 = h["eps"]
        chain.append(Link("torch_adafactor", (("learning_rate", learning_rate), ("beta2_decay", _f(h["beta2_decay"])),
                                              ("eps", (None if eps1 is None else _f(eps1), _f(eps2))),
                                              ("d", _f(h["d"])), ("weight_decay", wd)),
                          "torch's Adafactor: a relative step from the learning rate, the moment factored over "
                          "each matrix's last two axes"))
        return chain
    if name == "muon":
        chain.append(Link("torch_muon", (("learning_rate", learning_rate), ("weight_decay", wd),
                                         ("momentum", _f(h["momentum"])), ("nesterov", bool(h["nesterov"])),
                                         ("ns_coefficients", tuple(_f(c) for c in h["ns_coefficients"])),
                                         ("eps", _f(h["eps"])), ("ns_steps", int(h["ns_steps"])),
                                         ("adjust_lr_fn", h["adjust_lr_fn"])),
                          "torch's Muon: Newton-Schulz in bfloat16, the rate adjusted to each matrix's shape"))
        return chain
    b1, b2 = (_f(b) for b in h["betas"])
    eps = _f(h["eps"])
    inject = ("b1",) if mom is not None else ()
    b1v = mom if mom is not None else b1
    if name in ("adam", "adamw"):
        if h["amsgrad"]:
            chain.append(Link("scale_by_torch_amsgrad", (("b1", b1v), ("b2", b2), ("eps", eps)),
                              "torch's amsgrad keeps the largest raw second moment (optax's, the bias-corrected one)",
                              inject=inject))
        else:
            chain.append(Link("optax.scale_by_adam", (("b1", b1v), ("b2", b2), ("eps", eps), ("eps_root", 0.0)),
                              "torch: eps outside the square root (eps_root=0)", inject=inject))
    elif name == "adamax":
        chain.append(Link("optax.scale_by_adamax", (("b1", b1v), ("b2", b2), ("eps", eps)),
                          "torch's Adamax: the infinity norm max(b2 u, |g| + eps)", inject=inject))
    elif name == "nadam":
        chain.append(Link("scale_by_torch_nadam", (("b1", b1v), ("b2", b2), ("eps", eps),
                                                   ("momentum_decay", _f(h["momentum_decay"]))),
                          "torch's NAdam: the momentum schedule of Dozat's paper (optax.nadam has none)",
                          inject=inject))
    elif name == "radam":
        chain.append(Link("scale_by_torch_radam", (("b1", b1v), ("b2", b2), ("eps", eps)),
                          "torch's RAdam: eps added before the second moment's bias correction", inject=inject))
    if wd and decoupled:
        chain.append(Link("optax.add_decayed_weights", (("weight_decay", wd),),
                          "decoupled weight decay from the old parameters, scaled by the learning rate"))
    return chain + [lr_link]


def custom(chain: list) -> list:
    """The transforms.py functions a chain calls, in the order they first appear."""
    names = []
    for link in chain:
        if not link.fn.startswith("optax.") and link.fn not in names:
            names.append(link.fn)
    return names


def build(chain: list, values: dict | None = None):
    """The optax transformation of `chain`; `values` gives what its Exprs name."""
    import optax

    from flaxport.port.optimizers import transforms

    values = values or {}

    def resolve(fn):
        obj = optax if fn.startswith("optax.") else transforms
        for part in fn.removeprefix("optax.").split("."):
            obj = getattr(obj, part)
        return obj

    made = []
    for link in chain:
        kwargs = {k: values[v] if isinstance(v, Expr) else v for k, v in link.kwargs}
        fn = resolve(link.fn)
        if link.inject:
            static = tuple(k for k, v in link.kwargs if isinstance(v, bool) or v is None)
            fn = optax.inject_hyperparams(fn, static_args=static)
        made.append(fn(**kwargs))
    return optax.chain(*made)
