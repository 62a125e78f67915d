"""flaxport compare: every run in one process, the report schema later tools rely on."""
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_compare_writes_the_report_with_every_run(cli, tmp_path):
    pytest.importorskip("torch")
    work = tmp_path / "cmp"
    proc = cli("compare", "gan", "--config", "smoke", "--epochs", "2", "--workdir", work, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((work / "report.json").read_text())
    assert [r["name"] for r in rep["runs"]] == ["torch-eager", "torch-tuned", "jax-step", "jax-scan"]
    for r in rep["runs"]:
        assert len(r["epoch_seconds"]) == 2 and all(s > 0 for s in r["epoch_seconds"])
        assert set(r["quality"]) >= {"w1", "ks", "mode_share"}
        assert len(r["quality"]["mode_share"]) == 2
    jax_scan = next(r for r in rep["runs"] if r["name"] == "jax-scan")
    assert jax_scan["compile_seconds"] > 0
    summary = {s["name"]: s for s in rep["summary"]}
    assert summary["torch-eager"]["speedup_vs_torch_eager"] == 1.0
    md = (work / "report.md").read_text()
    assert "| jax-scan |" in md and "vs torch-eager" in md
    for name in ("torch-eager", "jax-scan"):
        assert (work / name / "histogram.png").exists()
    # The comparison's own picture, linked first from report.md.
    from PIL import Image

    with Image.open(work / "compare.png") as im:
        assert im.format == "PNG" and im.size[0] > 800 and im.size[1] > 600  # curves + bars + histograms
    assert md.index("](compare.png)") < md.index("](jax-scan/histogram.png)")
    # The JAX runners train the same numbers: their quality agrees exactly.
    jax_step = next(r for r in rep["runs"] if r["name"] == "jax-step")
    assert jax_step["quality"] == jax_scan["quality"]
