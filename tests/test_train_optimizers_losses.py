"""train_step.py for every torch.optim optimizer and every torch.nn loss: write_train_step proves
each over 5 steps (check_step, and the file's own train_step in float64 against torch), or
refuses it in one line saying why (test_translate_train_step.py checks those lines).

One representative runs by default (NAdam with L2 decay and a class-weighted, label-smoothed
cross-entropy); every optimizer and every loss is `slow`.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

from flaxport.translate import translate  # noqa: E402
from flaxport.translate.train_step import write_train_step  # noqa: E402

FLOAT64_TOL = 1e-10


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=False)  # a bias before BN: rounding noise
        self.bn = nn.BatchNorm2d(6)
        self.head = nn.Linear(6 * 2 * 2, 5)

    def forward(self, x):
        return self.head(nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1))


class MatrixNet(nn.Module):
    """Weights that are all matrices (Muon takes nothing else)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8, bias=False)
        self.fc2 = nn.Linear(8, 5, bias=False)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class Heads(nn.Module):
    """What each loss reads: logits, probabilities, log-probabilities, two or three embeddings."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.body = nn.Linear(6, 5)
        self.other = nn.Linear(6, 5)
        self.third = nn.Linear(6, 5)

    def forward(self, x):
        h = self.body(x)
        if self.kind == "probabilities":
            return torch.sigmoid(h)
        if self.kind == "log_probs":
            return torch.log_softmax(h, dim=1)
        if self.kind == "scores":  # margin_ranking_loss: one score a row
            return h[:, 0], self.other(x)[:, 0]
        if self.kind == "pair":
            return h, self.other(x)
        if self.kind == "triple":
            return h, self.other(x), self.third(x)
        return h


def _translated(module, x):
    torch.manual_seed(0)
    return translate(module.train(), x)


@pytest.fixture(scope="module")
def convnet():
    torch.manual_seed(0)
    module = ConvNet().train()
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return module, translate(module, x)


def _assert_proven(step):
    assert step.ok, step.markdown()
    worst = max(r[2] for r in step.rows)
    assert worst < FLOAT64_TOL, step.markdown()
    assert {r[0] for r in step.rows} == set(range(1, step.steps + 1)) and step.steps >= 5
    return worst


def test_nadam_and_weighted_smoothed_cross_entropy_are_proven(convnet):
    """The default run's representative: a chain with a transformation optax lacks (NAdam's
    momentum schedule, written into the file), L2 decay, and a loss with a tensor option."""
    module, t = convnet
    step = write_train_step(t, module, "torch.optim.NAdam(lr=1e-2, weight_decay=0.1)",
                            "nn.CrossEntropyLoss(weight=(1.0, 2.0, 0.5, 1.0, 3.0), label_smoothing=0.1)")
    _assert_proven(step)
    assert "def scale_by_torch_nadam(" in step.source and "WEIGHT = (1.0, 2.0, 0.5, 1.0, 3.0)" in step.source
    assert {r.phase for r in step.report.rows} >= {"loss", "grad", "running_stats", "param", "moment"}


OPTIMIZERS = [
    "torch.optim.SGD(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=1e-3)",
    "torch.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, maximize=True)",
    "torch.optim.Adam(lr=1e-2, amsgrad=True, weight_decay=0.1)",
    "torch.optim.AdamW(lr=1e-2, betas=(0.8, 0.95))",
    "torch.optim.RMSprop(lr=1e-2, momentum=0.5, centered=True, weight_decay=0.1)",
    "torch.optim.Adagrad(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)",
    "torch.optim.Adadelta(lr=0.5, weight_decay=0.1)",
    "torch.optim.Adamax(lr=1e-2)",
    "torch.optim.NAdam(lr=1e-2, decoupled_weight_decay=True, weight_decay=0.1)",
    "torch.optim.RAdam(lr=1e-2, weight_decay=0.1)",
    "torch.optim.ASGD(lr=0.05, lambd=0.01, t0=2)",
    "torch.optim.Rprop(lr=1e-2)",
    "torch.optim.Adafactor(lr=1e-2, weight_decay=0.1)",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", OPTIMIZERS)
def test_every_optimizer_is_proven(convnet, text):
    module, t = convnet
    _assert_proven(write_train_step(t, module, text, "torch.nn.functional.cross_entropy"))


@pytest.mark.slow
def test_muon_is_proven_on_matrices():
    """Muon's Newton-Schulz runs in bfloat16 on both sides, the same way (float32 accumulation,
    one rounding a matmul), so even its steps agree in float64."""
    torch.manual_seed(0)
    module = MatrixNet()
    t = _translated(module, torch.randn(6, 6))
    _assert_proven(write_train_step(t, module, "torch.optim.Muon(lr=0.02)", "F.cross_entropy"))


LOSSES = {  # the loss text -> what the model returns
    "nn.BCELoss(weight=(1.0, 0.5, 2.0, 1.0, 1.0))": "probabilities",
    "nn.BCEWithLogitsLoss(pos_weight=(2.0, 1.0, 1.0, 0.5, 1.0))": "logits",
    "nn.CrossEntropyLoss(ignore_index=2, reduction='sum')": "logits",
    "nn.NLLLoss(weight=(1.0, 2.0, 0.5, 1.0, 3.0))": "log_probs",
    "nn.MSELoss()": "logits", "nn.L1Loss(reduction='sum')": "logits", "nn.SmoothL1Loss(beta=0.5)": "logits",
    "nn.HuberLoss(delta=0.5)": "logits", "nn.KLDivLoss(reduction='batchmean')": "log_probs",
    "nn.PoissonNLLLoss()": "logits", "nn.HingeEmbeddingLoss(margin=0.5)": "logits",
    "nn.SoftMarginLoss()": "logits", "nn.MultiLabelSoftMarginLoss()": "logits",
    "nn.MultiLabelMarginLoss()": "logits", "nn.MultiMarginLoss(p=2, margin=0.5)": "logits",
    "nn.CosineEmbeddingLoss(margin=0.2)": "pair", "nn.MarginRankingLoss(margin=0.1)": "scores",
    "nn.TripletMarginLoss(margin=0.5, p=1.0)": "triple", "nn.TripletMarginWithDistanceLoss(swap=True)": "triple",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", sorted(LOSSES))
def test_every_loss_is_proven(text):
    torch.manual_seed(0)
    module = Heads(LOSSES[text])
    t = _translated(module, torch.randn(4, 6))
    step = write_train_step(t, module, "torch.optim.Adam(lr=1e-2)", text)
    _assert_proven(step)
    if LOSSES[text] == "triple":  # no targets: the step takes the inputs alone
        assert "def step(state, x):" in step.source


def test_a_loss_reading_more_outputs_than_the_model_has_is_one_line():
    from flaxport.translate.train_step import TrainStepError

    torch.manual_seed(0)
    module = Heads("logits")
    t = _translated(module, torch.randn(4, 6))
    with pytest.raises(TrainStepError, match="cosine_embedding_loss reads 2 outputs of the model, which returns 1"):
        write_train_step(t, module, "torch.optim.Adam()", "nn.CosineEmbeddingLoss()", check=False)


def test_loss_objects_are_read_with_their_options():
    from flaxport.translate.train_step import as_loss

    loss = as_loss(nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0]), label_smoothing=0.2))
    assert (loss.name, loss.kwargs) == ("cross_entropy", {"weight": (1.0, 2.0), "label_smoothing": 0.2})
    assert as_loss(nn.TripletMarginLoss(margin=2.0)).kwargs == {"margin": 2.0}
    assert np.isclose(float(as_loss(nn.HuberLoss(delta=0.3)).kwargs["delta"]), 0.3)


def test_composite_losses_export_keeps_whole_are_decomposed_by_torchs_table():
    """hinge_embedding_loss stays one op in torch.export's graph and has no handler: torch's own
    decomposition rewrites it into handled ops (translate/decompose.py); multilabel_margin_loss
    decomposes to its forward op, which the op table holds. Both proven in float64."""
    from flaxport.translate import translate_function

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g)
    sign = (torch.rand(4, 5, generator=g) > 0.5).float() * 2 - 1
    targets = torch.tensor([[0, 3, -1, 1, 1], [1, -1, 0, 0, 0], [4, 2, 0, -1, 3], [2, 2, -1, 0, 0]])
    for fn, y in ((torch.nn.functional.hinge_embedding_loss, sign), (torch.nn.functional.multilabel_margin_loss,
                                                                      targets)):
        translated = translate_function(fn, x, y)
        assert translated.report.ok and "unsupported" not in translated.source, translated.report


def test_an_op_with_neither_a_handler_nor_a_decomposition_is_refused_by_its_own_name():
    """airy_ai has no translation and torch has no decomposition of it: the refusal names the op
    the user wrote, while hinge_embedding_loss beside it is decomposed and translates."""
    from flaxport.translate import UnsupportedOpsError, translate_function

    def loss(x, sign):
        return torch.nn.functional.hinge_embedding_loss(x, sign) + torch.special.airy_ai(x).sum()

    x = torch.randn(2, 4, 5)
    with pytest.raises(UnsupportedOpsError) as e:
        translate_function(loss, x, torch.sign(x))
    assert "aten.special_airy_ai" in str(e.value)
    assert "hinge_embedding_loss" not in str(e.value)
