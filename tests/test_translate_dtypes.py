"""Casts a model pins (float32 inside a float64 or bfloat16 model) and orders torch leaves to its kernels."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


class RMSNorm(nn.Module):
    """HuggingFace's: the statistics in float32 whatever the model's dtype, then back."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + 1e-6)
        return self.weight * hidden_states.to(input_dtype)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(8)
        self.proj = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)  # train mode has an op more: node names differ between the modes

    def forward(self, x):
        residual = x  # the same tensor the norm's no-op cast returns in a float32 export
        y = self.drop(self.proj(self.norm(x)))
        return residual + y.to(x.dtype)


class Encoding(nn.Module):
    """timm's Fourier position encoding: made in float32, cast to the weights' dtype (BatchNorm: the
    train capture has ops the eval one lacks)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(4, 6, 1)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        ramp = torch.arange(x.shape[-1], dtype=torch.float32) / 3.0
        pos = torch.sin(ramp)[None, None, None, :].expand(x.shape[0], 4, x.shape[2], -1)
        return self.bn(self.proj(pos.to(self.proj.weight.dtype))) + x.mean()


def test_pinned_float32_stays_float32_in_the_float64_proof_and_train_check():
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    module = Block().eval()
    t = translate(module, torch.randn(2, 5, 8))
    assert t.report.ok, t.report.first_divergence
    assert "hidden_states.astype(jnp.float32)" in t.source
    assert "hidden_states_dtype = hidden_states.dtype" in t.source  # the input's name is taken over by then
    assert "hidden_states.astype(hidden_states_dtype)" in t.source
    report = check_train(t, module)  # float64 train forward: torch keeps the norm in float32 too
    assert report.ok, report.first_divergence


def test_no_op_cast_in_both_dtypes_is_not_written():
    from flaxport.translate import translate

    class Same(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(x).to(x.dtype) * 2

    t = translate(Same().eval(), torch.randn(3, 4))
    assert t.report.ok and "astype" not in t.source[t.source.index("class Same("):t.source.index("\ndef load(")]


def test_pinned_creation_and_the_cast_back_are_one_code_for_both_modes():
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    module = Encoding().eval()
    t = translate(module, torch.randn(2, 4, 3, 5))
    assert t.report.ok, t.report.first_divergence
    assert "jnp.arange(x.shape[3], dtype=jnp.float32)" in t.source and "self.training" not in t.source
    report = check_train(t, module)
    assert report.ok, report.first_divergence


def test_unstable_sort_ties_are_compared_in_one_order_torch_may_give():
    """A mixture of experts: token slots sorted by expert id (many ties), a layer on the sorted rows,
    then put back. torch's unstable sort orders equal keys its own way; the sorted rows compare."""
    from flaxport.translate import translate

    class Dispatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(6, 3)
            self.expert = nn.Sequential(nn.Linear(6, 6), nn.GELU())

        def forward(self, x):
            ids = self.router(x).argmax(-1)
            order = torch.sort(ids)[1]
            rows = self.expert(x[order])
            return torch.zeros_like(rows).index_copy(0, order, rows)

    t = translate(Dispatch().eval(), torch.randn(24, 6))
    assert t.report.ok, t.report.first_divergence


def test_mixture_of_experts_from_huggingface_proves_and_trains():
    """transformers' grouped expert product (its own op), an unstable sort of the slots, and a train
    check in float32 where torch's eager grouped_mm has no float64 kernel."""
    transformers = pytest.importorskip("transformers")
    from flaxport.bench.zoos import import_torchvision
    from flaxport.translate import translate

    import_torchvision()  # transformers' model imports reach torchvision (its CPU-less wheel here)
    from flaxport.translate.proof import FLOAT32_TOLERANCE, check_train

    config = transformers.MixtralConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=32)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.MixtralModel(config).eval()
    ids = torch.randint(0, 50, (2, 7))
    t = translate(model, ids, example_kwargs={"use_cache": False})
    assert t.report.ok, t.report.first_divergence
    assert "lax.ragged_dot(" in t.source
    report = check_train(t, model)
    assert report.ok, report.first_divergence
    assert all("float32" in row.note for row in report.rows) and report.atol == FLOAT32_TOLERANCE


class Rotary(nn.Module):
    """Computed in float32, returned in the model's dtype: sin made first, cos returned first."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, 8, 2).float() / 8))

    def forward(self, x, positions):
        freqs = positions[..., None].float() * self.inv_freq.float()
        sin = torch.cat([freqs.sin(), freqs.sin()], -1)
        cos = torch.cat([freqs.cos(), freqs.cos()], -1)
        return cos.to(x.dtype), sin.to(x.dtype)


class Rotated(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, positions):
        cos, sin = self.rotary(x, positions)
        q = self.proj(x)
        return q * cos + q.flip(-1) * sin


def test_outputs_a_cast_reorders_in_float64_are_compared_in_the_translations_order():
    from flaxport.translate import translate

    x, positions = torch.randn(2, 5, 8), torch.arange(5)[None].expand(2, 5)
    t = translate(Rotated().eval(), x, positions)
    assert t.report.ok, t.report.first_divergence


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, mask):
        mask = mask.type_as(x)
        return self.linear(x) * mask[..., None]


class EncoderDecoder(nn.Module):
    """HF Funnel's pattern: a float32 mask made in forward, cast by both halves. In float32 the
    encoder's cast is the mask itself, so the decoder reads it from the encoder; in float64 not."""

    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = Masked(), Masked()

    def forward(self, x):
        mask = torch.ones(x.shape[:2])
        return self.decoder(self.encoder(x, mask), mask)


def test_a_call_returning_more_in_float32_than_in_float64_is_compared_output_by_output():
    from flaxport.translate import translate

    t = translate(EncoderDecoder().eval(), torch.randn(2, 5, 8))
    assert t.report.ok, t.report.first_divergence
    encoder = [r for r in t.report.rows if r.torch_name == "encoder"]
    assert len(encoder) == 1 and encoder[0].ok and encoder[0].shape == (2, 5, 8), encoder


def test_parameters_read_on_one_line_take_their_names_in_the_order_the_line_writes_them():
    from flaxport.translate import translate

    t = translate(EncoderDecoder().eval(), torch.randn(2, 5, 8))
    masked = t.source[t.source.index("class Masked("):t.source.index("\ndef load(")]
    assert "mask = mask.astype(x.dtype)" in masked, masked
    assert "self.linear(x)" in masked, masked


class L2Norm(nn.Module):
    """`x.float()` is x itself in a float32 model, so torch.export reads `.type_as(x)` from the cast."""

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).sum(-1, keepdim=True) + 1e-6)).type_as(x)


class TwiceNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = L2Norm()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        return self.norm(x + self.proj(self.norm(x)))  # one instance, two calls: one class, one code


def test_reads_of_a_tensor_after_its_no_op_cast_read_the_tensor():
    from flaxport.translate import translate

    t = translate(TwiceNormed().eval(), torch.randn(3, 6))
    assert t.report.ok, t.report.first_divergence
    assert ".astype(x.dtype)" in t.source and "to.dtype" not in t.source


class Picker(nn.Module):
    def forward(self, scores):
        return torch.relu(scores).topk(3, dim=-1).indices  # rows with fewer than 3 positives: ties at 0


class TopThree(nn.Module):
    def __init__(self):
        super().__init__()
        self.picker = Picker()

    def forward(self, x):
        return torch.relu(x).gather(-1, self.picker(x)).sum(-1)


def test_top_k_ties_are_compared_in_one_order_torch_may_give():
    from flaxport.translate import translate

    x = torch.randn(8, 6) - 1.2
    assert ((x > 0).sum(-1) < 3).any()
    t = translate(TopThree().eval(), x)
    assert t.report.ok, t.report.first_divergence


class PinnedRouter(nn.Module):
    """A mixture-of-experts router as HF writes it: `hidden_states.float()` against a weight of its own,
    so torch's own float64 forward fails ("float != double") and the train check runs in float32."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.weight = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return torch.nn.functional.linear(self.proj(x).float(), self.weight).softmax(-1)


def test_a_float32_pinned_against_a_weight_checks_train_mode_in_float32():
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    module = PinnedRouter().train()
    with pytest.raises(RuntimeError, match="float != double"):
        PinnedRouter().double()(torch.randn(2, 4, dtype=torch.float64))
    t = translate(module, torch.randn(2, 4), check=False)
    report = check_train(t, module)
    assert report.ok, report.first_divergence
    assert "torch cannot run it in float64" in report.rows[0].note


class ZeroRouter(nn.Module):
    """A router as HF initialises one (its gate all zeros): every score ties, and which experts the
    top-k picks changes the output. torch's CPU kernel picks the highest indices, lax.top_k the lowest."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(6, 4, bias=False)
        nn.init.zeros_(self.gate.weight)
        self.experts = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        weights, chosen = self.gate(x).softmax(-1).topk(2, dim=-1)
        return (weights.unsqueeze(-1) * self.experts[chosen]).sum(1)


def test_top_k_ties_that_pick_other_experts_prove_against_torch_taking_them_in_order(tmp_path):
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train
    from flaxport.translate.written import check_written

    module, x = ZeroRouter().eval(), torch.randn(5, 6)
    assert torch.topk(torch.zeros(4), 2).indices.tolist() != [0, 1]  # the kernel this test is about
    t = translate(module, x)
    assert t.report.ok, t.report.first_divergence
    report = check_train(t, module)
    assert report.ok, report.first_divergence
    t.save(tmp_path)
    assert check_written(t, module, tmp_path).problem == ""


class FloatMask(nn.Module):
    """HF Canine's mask: built in float32 whatever the model's dtype, scaled by the scores' dtype's
    minimum. In float64 that minimum overflows float32 to -inf and 0 * -inf is NaN: torch's own
    float64 forward is NaN where its float32 forward is not."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        mask = torch.ones(x.shape[0], x.shape[1])
        scores = self.proj(x) @ x.transpose(1, 2)
        return (scores + ((1.0 - mask) * torch.finfo(scores.dtype).min).unsqueeze(1)).softmax(-1)


def test_a_model_torch_itself_makes_nan_in_float64_is_proved_in_float32():
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    module, x = FloatMask().eval(), torch.randn(2, 3, 4)
    with torch.no_grad():
        assert module.double()(x.double()).isnan().all() and module.float()(x).isfinite().all()
    t = translate(module, x)
    assert t.report.ok and t.report.precision == "float32", t.report.first_divergence
    assert "float64 forward gives NaN/inf where float32 does not" in t.report.notes[0]
    report = check_train(t, module.train())
    assert report.ok and "torch cannot run it in float64" in report.rows[0].note, report.first_divergence
