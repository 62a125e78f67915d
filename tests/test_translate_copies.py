"""The copies translate and its proof run the user's module on: cast as they are copied, or sharing
its weights while no op writes them, and the module left as it was either way; the translation's
models share one copy of the weights."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

from flaxport.translate.copies import BUFFERS, PARAMETERS, WritesShared, copy_as, on_copy, writes_refused  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


class WritesItsWeight(nn.Module):
    """A forward that scales its own weight in place, once (HF RWKV rescales its blocks this way)."""

    def __init__(self, catch: bool = False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.catch = catch
        self.scaled = False

    def forward(self, x):
        if not self.scaled:
            with torch.no_grad():
                try:
                    self.fc.weight.view(-1)[:4].mul_(3.0)  # through a view of the weight
                except RuntimeError:
                    if not self.catch:
                        raise
            self.scaled = True
        return self.fc(x)


def test_a_shared_copy_holds_the_modules_parameters_and_copies_its_buffers():
    module = Net()
    shared = copy_as(module, share=(PARAMETERS,))
    assert all(a is b for a, b in zip(shared.parameters(), module.parameters()))
    assert not any(a.data_ptr() == b.data_ptr() for a, b in zip(shared.buffers(), module.buffers()))
    both = copy_as(module, share=(PARAMETERS, BUFFERS))
    assert all(a is b for a, b in zip(both.buffers(), module.buffers()))
    cast = copy_as(module, torch.float64)
    assert cast.conv.weight.dtype == torch.float64 and cast.bn.num_batches_tracked.dtype == torch.int64
    assert torch.equal(cast.conv.weight, module.conv.weight.double()) and module.conv.weight.dtype == torch.float32
    with pytest.raises(ValueError):
        copy_as(module, torch.float64, share=(PARAMETERS,))


def test_a_write_through_a_view_of_a_shared_weight_is_refused_before_it_writes():
    w = torch.ones(2, 3)
    refused = []
    with pytest.raises(WritesShared), writes_refused([w], refused):
        w.view(-1)[1:].add_(1.0)
    assert torch.equal(w, torch.ones(2, 3)) and refused == ["aten.add_.Tensor"]
    with writes_refused([w], refused):
        assert torch.equal(w * 2, torch.full((2, 3), 2.0))  # reading is free


@pytest.mark.parametrize("catch", [False, True], ids=["raises", "catches-the-refusal"])
def test_a_forward_that_writes_its_weights_runs_on_a_copy_of_its_own_and_leaves_the_module_as_it_was(catch):
    module, x = WritesItsWeight(catch), torch.randn(2, 4)
    before = module.fc.weight.clone()
    expected = WritesItsWeight(catch)
    expected.load_state_dict(module.state_dict())
    copies = []

    def forward(m):
        copies.append(m)
        with torch.no_grad():
            return m(x)

    out = on_copy(module, forward, training=False)
    assert torch.equal(module.fc.weight, before) and not module.scaled
    assert len(copies) == 2 and copies[1].fc.weight is not module.fc.weight
    with torch.no_grad():
        assert torch.equal(out, expected(x))  # the forward as torch runs it: the weight scaled


def test_a_train_mode_forward_updates_the_copys_statistics_not_the_modules():
    module, x = Net().eval(), torch.randn(2, 3, 8, 8)
    mean = module.bn.running_mean.clone()

    def forward(m):
        assert m.training and m.bn.training and m.conv.weight is module.conv.weight
        with torch.no_grad():
            m(x)
        return m.bn.running_mean.clone()

    updated = on_copy(module, forward, training=True)
    assert torch.equal(module.bn.running_mean, mean) and not module.training
    assert not torch.equal(updated, mean)


def test_translate_leaves_a_module_that_writes_its_weights_as_it_was():
    from flaxport.translate import translate

    module, x = WritesItsWeight().eval(), torch.randn(2, 4)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    translate(module, x)
    assert all(torch.equal(v, state[k]) for k, v in module.state_dict().items()) and not module.scaled


def test_the_translations_models_share_one_copy_of_the_weights():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flaxport.translate import translate

    module = Net().eval()
    t = translate(module, torch.randn(2, 3, 8, 8), check=False)

    def pointers(model):
        return [v.get_value().unsafe_buffer_pointer() for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]

    assert pointers(t.new_model()) == pointers(t.model)
    kernel = t.model.conv.weight
    kernel.set_value(kernel.get_value() + 1.0)  # the user trains t.model: new models keep torch's weights
    np.testing.assert_array_equal(np.asarray(t.new_model().conv.weight.get_value()),
                                  module.conv.weight.detach().numpy())
    with jax.enable_x64(True):
        assert t.new_model(dtype=jnp.float64).conv.weight.get_value().dtype == jnp.float64
    f64 = t.plan.f64.module  # the float64 capture holds no weights once translated: the proof casts its own
    assert all(p.is_meta for p in f64.parameters()) and all(b.is_meta for b in f64.buffers())
    from flaxport.translate.proof import prove

    assert prove(t, module).ok
