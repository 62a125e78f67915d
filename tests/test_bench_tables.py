"""`python -m flaxport.bench.tables`: the benchmarks page's tables from what `make bench` leaves."""
import json

from flaxport.bench import tables


def _report(tmp_path):
    runs = [("torch-tuned", "torch", 78, [2.0, 1.2, 1.0]), ("jax-scan", "jax", 78, [5.0, 0.3, 0.25])]
    rep = {"workload": "gan", "epochs": 3, "machine": {"cpu_count": 2, "jax": "0.10.2", "torch": "2.13.0+cpu"},
           "runs": [{"name": n, "framework": f, "seed": 0, "steps_per_epoch": s, "epoch_seconds": e}
                    for n, f, s, e in runs],
           "summary": [{"name": n, "seeds": 1, "steady_epoch_seconds": sum(e[1:]) / 2, "first_epoch_seconds": e[0],
                        "compile_seconds": 4.5 if f == "jax" else 0.0, "gflop_per_s": None,
                        "quality": {"ks": {"mean": 0.05, "std": 0.0}, "w1": {"mean": 0.0123, "std": 0.0}}}
                       for n, f, s, e in runs]}
    (tmp_path / "gan-quick").mkdir()
    (tmp_path / "gan-quick" / "report.json").write_text(json.dumps(rep))


def test_a_comparison_becomes_its_table_with_the_command_and_the_ratios(tmp_path):
    _report(tmp_path)
    (tmp_path / "gan-torch-compiled").mkdir()
    (tmp_path / "gan-torch-compiled" / "metrics.jsonl").write_text(
        "".join(json.dumps({"epoch": i + 1, "epoch_seconds": s, "steps": 2000}) + "\n" for i, s in enumerate([30, 4, 5])))
    text = tables.tables(tmp_path)
    assert "`flaxport compare gan --config quick --epochs 20 --runs torch-tuned,jax-scan`" in text
    # steady: torch 1.1 s, jax 0.275 s -> 4.00x; 0.275 s / 78 steps = 3.53 ms; quality: the workload's W1
    assert "| jax-scan | 0.275 | 3.53 | - | - | 4.00x | 5.00 | 4.50 | 0.0123 |" in text
    assert "| torch-compiled | 4.500 | 30.0 |" in text
    assert "(no cnn results" in text and "jax 0.10.2" in text and "2-CPU" in text


def test_a_vectorised_comparison_becomes_a_member_steps_table(tmp_path):
    rep = {"workload": "gan", "epochs": 3, "machine": {"cpu_count": 2},
           "runs": [], "summary": [
               {"name": "jax-scan", "members": 1, "steady_epoch_seconds": 0.5, "member_steps_per_second": 4000.0,
                "member_steps_per_second_with_compile": 1000.0},
               {"name": "jax-vmap", "members": 32, "steady_epoch_seconds": 16.0, "member_steps_per_second": 4000.0 * 2,
                "member_steps_per_second_with_compile": 7000.0},
               {"name": "torch-tuned", "members": 1, "steady_epoch_seconds": 5.0, "member_steps_per_second": 400.0,
                "member_steps_per_second_with_compile": 390.0}]}
    (tmp_path / "gan-vmap").mkdir()
    (tmp_path / "gan-vmap" / "report.json").write_text(json.dumps(rep))
    text = tables.tables(tmp_path)
    assert f"`{tables.VMAP['gan-vmap']}`: steady epochs 2..3" in text
    assert "| jax-vmap | 32 | 16.000 | 8000 | 7000 | 2.00x | 20.00x |" in text
    assert "(no vae-vmap results" in text


def test_a_vectorised_run_in_a_plain_comparison_is_shown_per_member():
    rep = {"workload": "cnn", "epochs": 5,
           "runs": [{"name": "jax-scan", "steps_per_epoch": 44}, {"name": "jax-vmap", "steps_per_epoch": 44}],
           "summary": [{"name": "jax-scan", "seeds": 3, "steady_epoch_seconds": 0.5, "first_epoch_seconds": 2.0,
                        "compile_seconds": 1.5, "quality": {}},
                       {"name": "jax-vmap", "seeds": 3, "members": 3, "steady_epoch_seconds": 3.0,
                        "first_epoch_seconds": 4.0, "compile_seconds": 2.5, "quality": {}}]}
    text = "\n".join(tables.compare_table(rep, "flaxport compare cnn --epochs 5 --seeds 3"))
    # 3.0 s trains 3 members: 1.0 s and 22.73 ms a step per member
    assert "| jax-vmap (3 members; s/epoch and ms/step per member) | 1.000 | 22.73 |" in text
