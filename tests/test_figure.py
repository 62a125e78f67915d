"""compare.png: the speed-ups written on it, and one drawn for a workload without sample pictures."""
from flaxport.bench import figure
from flaxport.harness.loop import RunResult
from flaxport.workloads import registry


def _rep(seconds: dict) -> dict:
    return {"workload": "cnn", "config": {"variant": "smoke"}, "epochs": 2,
            "machine": {"cpu_count": 2, "jax": "x", "torch": "y"},
            "summary": [{"name": n, "steady_epoch_seconds": s} for n, s in seconds.items()]}


def test_speed_ups_are_against_torch_eager_else_the_first_torch_run():
    base, rows = figure.speeds(_rep({"torch-eager": 2.0, "torch-tuned": 1.0, "jax-scan": 0.5}))
    assert base == "torch-eager"
    assert rows == [("torch-eager", 2.0, 1.0), ("torch-tuned", 1.0, 2.0), ("jax-scan", 0.5, 4.0)]
    base, rows = figure.speeds(_rep({"torch-tuned": 1.5, "jax-scan": 0.5}))
    assert base == "torch-tuned" and rows[1] == ("jax-scan", 0.5, 3.0)
    assert figure.speeds(_rep({"jax-step": 1.0, "jax-scan": 0.5}))[0] == "jax-step"


def test_a_vectorised_run_is_timed_per_member():
    rep = _rep({"torch-eager": 2.0, "jax-vmap": 3.0})
    rep["summary"][1]["members"] = 3  # one epoch trains 3 members: 1.0 s each
    assert figure.speeds(rep)[1][1] == ("jax-vmap (per member of 3)", 1.0, 2.0)


def test_a_workload_without_samples_gets_curves_and_bars(tmp_path):
    history = [{"epoch": e, "quality": {"accuracy": a}} for e, a in ((1, 0.8), (2, 0.9))]
    results = [(0, RunResult(n, n.split("-")[0], [3.0, s], 0.0, {"accuracy": 0.9}, history))
               for n, s in (("torch-eager", 2.0), ("jax-scan", 0.5))]
    rep = _rep({"torch-eager": 2.0, "jax-scan": 0.5})
    path = figure.write(tmp_path / "compare.png", registry.get("cnn"), None, rep, results)
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 800 and 300 < im.size[1] < 600  # one row: no sample panels
