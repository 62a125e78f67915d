"""bench.convnets (translated models against torch eager) and bench.convs (routes per conv class)."""
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


def _small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(16, 10)).eval()


def test_time_translation_times_forward_and_train_step_against_torch():
    from flaxport.bench.convnets import time_translation

    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    r = time_translation(_small_cnn(), x, rounds=2)
    for part in ("forward", "step"):
        f = r[part]
        assert f["torch_ms"] > 0 and f["jax_ms"] > 0 and f["torch_cpu_ms"] > 0
        assert f["ratio"] == pytest.approx(f["jax_ms"] / f["torch_ms"], rel=2e-2, abs=1e-3)
    assert r["rounds"] == 2 and set(r["compile_s"]) == {"jax forward", "jax step"}


@pytest.mark.slow
def test_saved_files_are_timed_as_translated(tmp_path):
    """--save writes model.py and train_step.py; --load times those files, not a new translation."""
    from flaxport.bench.convnets import time_translation
    from flaxport.translate import translate
    from flaxport.translate.train_step import write_train_step

    module = _small_cnn()
    x = torch.randn(4, 3, 16, 16)
    t = translate(module, x, check=False)
    write_train_step(t, module, "torch.optim.SGD(lr=0.01, momentum=0.9)", "torch.nn.functional.cross_entropy",
                     check=False)
    t.save(tmp_path / "net")
    r = time_translation(module, x, rounds=1, files=str(tmp_path / "net"))
    assert r["forward"]["jax_ms"] > 0 and r["step"]["jax_ms"] > 0


def test_model_groups_and_bad_arguments():
    from flaxport.bench import catalog
    from flaxport.bench.convnets import _args

    args = _args(["--models", "gpu,resnet18", "--sizes", "64"])
    assert args.models == list(catalog.GPU_MODELS) + ["resnet18"] and args.sizes == [64]
    assert len(_args([]).models) == len(catalog.CNNS)
    every = _args(["--models", "torchvision-all"]).models
    assert len(every) == 68 and set(catalog.TORCHVISION_CNNS) < set(every) and "regnet_y_128gf" in every
    assert not catalog.fits("vit_b_16", 64) and catalog.fits("gpt-small", 64) and not catalog.fits("inception_v3", 64)
    for bad in (["--sizes", "a"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            _args(bad)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_conv_routes_benchmark_measures_every_route(tmp_path, dtype):
    out = tmp_path / "convs.json"
    subprocess.run([sys.executable, "-m", "flaxport.bench.convs", "--rounds", "1", "--classes", "512 channels, 4x4",
                    "--dtype", dtype, "--json", str(out)], check=True, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert result["dtype"] == dtype
    assert set(row["gflops"]) == {"flaxport kernels", "XLA", "torch oneDNN"}
    assert all(v > 0 for parts in row["gflops"].values() for v in parts.values())
