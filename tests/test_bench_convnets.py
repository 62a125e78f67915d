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
    assert r.get("stolen_s", 0) >= 0 and r.get("timed_s", 1) > 0


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


def test_stolen_time_is_read_from_the_kernel_s_counters_and_a_disturbed_row_is_named(tmp_path, monkeypatch, capsys):
    """On a virtual machine the host can take the CPUs for seconds: Linux counts it (steal, the
    eighth figure of /proc/stat's cpu line, in clock ticks), each row keeps what its rounds lost
    and the run names the rows it disturbed."""
    import os

    from flaxport.bench import convnets

    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  6100729 11 553796 2365184 8693 0 970 {3 * ticks} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert convnets.stolen_seconds(str(stat)) == pytest.approx(3.0)
    stat.write_text("intr 1 2 3\n")
    assert convnets.stolen_seconds(str(stat)) is None
    assert convnets.stolen_seconds(str(tmp_path / "absent")) is None

    def row(model, stolen):
        timing = {"torch_ms": 2.0, "jax_ms": 1.0, "ratio": 0.5, "cpu_ratio": 0.5}
        return {"model": model, "size": 64, "forward": timing, "step": timing, "stolen_s": stolen, "timed_s": 24.0}

    monkeypatch.setattr(convnets, "run", lambda args: {
        "rows": [row("resnet18", 0.02), row("vgg11", 1.26)], "threads": 2, "dtype": "float32", "jax": "j",
        "torch": "t", "load_average_before": (1.0,), "load_average_after": (1.0,)})
    assert convnets.main(["--models", "resnet18,vgg11", "--sizes", "64"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "vgg11 at 64 (1.3 s in 24 s)" in last and "resnet18" not in last
