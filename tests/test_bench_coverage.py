"""`python -m flaxport.bench.coverage`: each case in its own process under limits, its records and tables."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from flaxport.bench.coverage import runner, table
from flaxport.bench.coverage.__main__ import main

# A source of cases that fail the ways a zoo's cases fail, and two that translate (tiny torch modules).
SOURCE = '''
import os, re, time

NAMES = ["linear", "refused", "branchy", "broken", "crash", "busy", "hung", "hungry"]


def names(filter=None):
    return [n for n in NAMES if filter is None or re.search(filter, n)]


def build(name):
    if name == "broken":
        raise ValueError("no such model here")
    if name == "crash":
        os._exit(7)
    if name == "busy":
        while True:
            pass
    if name == "hung":
        time.sleep(120)
    if name == "hungry":
        hoard = b"x" * (600 * 2**20)
        time.sleep(120)
    import torch

    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    class Det(torch.nn.Module):
        def forward(self, x):
            return torch.special.airy_ai(x).sum(-1)

    torch.manual_seed(0)
    module = {"linear": lambda: torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU()),
              "refused": Det, "branchy": Branchy}[name]()
    x = torch.randn(2, 4, 4) if name == "refused" else torch.randn(2, 4)
    return [(module.eval(), (x,), {})]
'''


@pytest.fixture
def zoo(tmp_path, monkeypatch):
    """The dotted name of the source above, importable here and in the case processes."""
    (tmp_path / "fakezoo").mkdir()
    (tmp_path / "fakezoo" / "__init__.py").write_text("")
    (tmp_path / "fakezoo" / "cases.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "fakezoo.cases"


def test_a_case_past_its_time_or_memory_limit_is_stopped_and_says_where_it_was(zoo):
    busy = runner.run_case(zoo, "busy", timeout=1, memory_gb=0)  # CPU seconds: a shared machine's load aside
    assert busy["step"] == "build" and busy["reason"] == "stopped: over the time limit (1 CPU s) while in build"
    assert 1 <= busy["cpu_seconds"] < 3 and busy["proof"] is False
    hung = runner.run_case(zoo, "hung", timeout=0.5, memory_gb=0)  # no CPU used: stopped by the wall clock
    assert hung["reason"] == f"stopped: over the wall-time limit ({runner.WALL_FACTOR * 0.5:g} s) while in build"
    assert runner.WALL_FACTOR * 0.5 <= hung["seconds"] < 30
    hungry = runner.run_case(zoo, "hungry", timeout=60, memory_gb=0.3)
    assert hungry["reason"] == "stopped: over the memory limit (0.3 GB) while in build", hungry
    assert hungry["seconds"] < 30


def test_a_case_that_cannot_be_built_or_kills_its_process_is_a_record_not_a_crash(zoo):
    broken = runner.run_case(zoo, "broken", timeout=60, memory_gb=0)
    assert broken["step"] == "build" and broken["reason"] == "not built: ValueError: no such model here"
    assert broken["export"] is None and broken["translated"] is False
    crash = runner.run_case(zoo, "crash", timeout=60, memory_gb=0)
    assert crash["step"] == "build" and crash["reason"].startswith("the case process died in build (exit 7"), crash


def test_cases_run_side_by_side_with_jobs_each_record_written_once(zoo, tmp_path):
    out = tmp_path / "zoo.jsonl"
    start = time.perf_counter()
    with open(out, "w") as f:
        records = runner.run(zoo, ["hung", "broken", "crash"], timeout=1, memory_gb=0, jobs=3, out=f)
    elapsed = time.perf_counter() - start
    assert sorted(r["name"] for r in records) == ["broken", "crash", "hung"]
    assert [r["name"] for r in records][-1] == "hung"  # written as they finish: the hung case last
    assert [json.loads(line)["name"] for line in out.read_text().splitlines()] == [r["name"] for r in records]
    # side by side: the run takes about its longest case, not the three cases' sum
    assert elapsed < sum(r["seconds"] for r in records) - 0.5 * min(r["seconds"] for r in records)


def test_jobs_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--source", "opinfo", "--jobs", "0"])
    assert e.value.code == 2 and "--jobs must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.torch
def test_cases_are_proved_refused_or_not_captured_with_their_reason(zoo, tmp_path, capsys):
    out = tmp_path / "zoo.jsonl"
    assert main(["--source", zoo, "--filter", "^(linear|refused|branchy)$", "--json", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["run"]["command"].startswith("python -m flaxport.bench.coverage --source fakezoo.cases")
    records = {r["name"]: r for r in map(json.loads, lines[1:])}
    linear = records["linear"]
    assert linear["proof"] and linear["step"] == "" and linear["export"] and linear["translated"]
    assert linear["lines"] > 10 and linear["float32"] < 1e-5 and linear["parameters"] == 4 * 3 + 3 + 3 + 3
    assert set(linear["samples"][0]["seconds"]) == {"export", "translate", "proof", "train", "files"}
    refused = records["refused"]
    assert (refused["export"], refused["translated"], refused["step"]) == (True, False, "translate")
    assert refused["reason"].startswith("UnsupportedOpsError: no translation for aten.special_airy_ai.default")
    branchy = records["branchy"]
    assert (branchy["export"], branchy["step"]) == (False, "export") and branchy["reason"].startswith("torch.export: ")
    text = capsys.readouterr().out
    assert "| fakezoo.cases | 3 | 3 | 2 | 1 | 1 | 50% |" in text
    assert "| linear | Sequential | 21 | yes | yes | yes |" in text
    # the tables again, from the file alone; --resume runs nothing that is there
    assert main(["--table", str(out)]) == 0 and capsys.readouterr().out == text
    assert main(["--source", zoo, "--filter", "^(linear|refused|branchy)$", "--json", str(out), "--resume"]) == 0
    assert capsys.readouterr().out == text and len(out.read_text().splitlines()) == 4


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("source, name", [("torchvision", "^squeezenet1_1$"), ("hf", "^bert$"), ("timm", "^mlp_mixer$")])
def test_a_zoo_case_is_built_small_translated_and_proved(source, name, tmp_path):
    """One case per zoo from a clean process, with torchax beside it where it is installed."""
    if not _installed({"hf": "transformers"}.get(source, source)):  # (a plain import of PyPI's torchvision fails)
        pytest.skip(f"{source} is not installed")
    peer = ["--peer", "torchax"] if _installed("torchax") else []
    out = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-m", "flaxport.bench.coverage", "--source", source, "--filter", name,
                           "--json", str(out), *peer], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text().splitlines()[1])
    assert record["proof"], record["reason"]
    assert record["float32"] < 1e-3 and record["lines"] > 20
    if peer:
        assert record["peer"]["name"] == "torchax" and record["peer"]["ok"], record["peer"]


def _installed(package) -> bool:
    from importlib import metadata

    try:
        metadata.version(package)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_a_source_that_is_not_there_is_one_line(capsys):
    with pytest.raises(runner.SourceMissing, match=r"^--source nosuch: this flaxport has no "
                                                   r"flaxport/bench/coverage/nosuch\.py$"):
        runner.source_module("nosuch")
    with pytest.raises(SystemExit) as e:
        main(["--source", "nosuch"])
    assert e.value.code == 2 and "choose opinfo, hf, timm, torchvision" in capsys.readouterr().err


RECORDS = [
    {"name": "bert", "model": "BertModel", "parameters": 25536, "export": True, "translated": True, "proof": True,
     "float32": 4.8e-07, "lines": 316, "seconds": 38.9, "step": "", "reason": "",
     "peer": {"name": "torchax", "ok": True, "float32": 7e-07, "reason": ""}},
    {"name": "swin", "model": "SwinModel", "parameters": 1_234_567, "export": True, "translated": True,
     "proof": False, "float32": None, "lines": 900, "seconds": 120.2, "step": "proof",
     "reason": "float64 proof fails first at 'encoder' (max |diff| 0.3)",
     "peer": {"name": "torchax", "ok": False, "float32": None, "reason": "NotImplementedError: aten.x"}},
    {"name": "longformer", "model": "LongformerModel", "parameters": 50_000, "export": False, "translated": False,
     "proof": False, "float32": None, "lines": None, "seconds": 20.0, "step": "export",
     "reason": "torch.export: GuardOnDataDependentSymNode: Could not guard | on data"},
    {"name": "maxvit", "model": None, "parameters": None, "export": None, "translated": False, "proof": False,
     "float32": None, "lines": None, "seconds": 300.4, "step": "translate",
     "reason": "stopped: over the time limit (300 CPU s) while in translate"},
    {"name": "blip", "model": None, "parameters": None, "export": None, "translated": False, "proof": False,
     "float32": None, "lines": None, "seconds": 9.0, "step": "build", "reason": "not built: RuntimeError: no input"},
]


def test_the_tables_count_each_case_as_far_as_it_got():
    assert table.counts(RECORDS) == {"cases": 5, "built": 4, "captured": 3, "translated": 2, "proved": 1,
                                     "eval_proved": 1, "peer": 1}
    assert table.summary({"hf": RECORDS}, "torchax") == (
        "| source | cases | built | captured (torch.export) | translated | proved | proved, of captured "
        "| proved in eval mode, of captured | torchax |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| hf | 5 | 4 | 3 | 2 | 1 | 33% | 33% (1) | 1 |\n")


def test_a_model_whose_train_mode_alone_fails_counts_as_proved_in_eval_mode():
    """The float64 proof and the written files held, the train-mode check did not (LayerDrop's
    branch on a random draw): proved in eval mode, not proved. A files failure beside it, or a
    record that does not say which checks failed, is not."""
    train_only = {**RECORDS[1], "name": "m2m", "step": "train", "failed": ["train"]}
    files_too = {**train_only, "name": "detr", "failed": ["train", "files"]}
    unsaid = {k: v for k, v in train_only.items() if k != "failed"}
    records = [RECORDS[0], train_only, files_too, unsaid]
    assert [table.proved_in_eval_mode(r) for r in records] == [True, True, False, False]
    counts = table.counts(records)
    assert (counts["proved"], counts["eval_proved"]) == (1, 2)
    assert table.summary({"hf": records}).splitlines()[2] == "| hf | 4 | 4 | 4 | 4 | 1 | 25% | 50% (2) |"


def test_a_case_says_which_checks_failed_over_all_its_samples():
    from flaxport.bench.coverage.case import summarize

    sample = {"model": "M", "parameters": 1, "export": True, "translated": True, "proof": False, "float32": None,
              "lines": 10, "step": "train", "reason": "train mode could not be captured", "failed": ["train"]}
    other = {**sample, "step": "proof", "reason": "float64 proof fails", "failed": ["proof", "train"]}
    assert summarize([sample])["failed"] == ["train"]
    assert summarize([sample, other])["failed"] == ["proof", "train"]
    assert "failed" not in summarize([{k: v for k, v in sample.items() if k != "failed"}])


def test_the_case_table_has_a_row_per_case_with_its_figures_and_reason():
    text = table.markdown(RECORDS, "torchax").splitlines()
    assert text[0] == ("| case | model | parameters | captured | translated | proved | float32 diff | lines | s "
                       "| torchax | reason |")
    assert text[2] == "| bert | BertModel | 26k | yes | yes | yes | 4.8e-07 | 316 | 39 | yes |  |"
    assert text[3] == ("| swin | SwinModel | 1.2M | yes | yes | no | - | 900 | 120 | no "
                       "| float64 proof fails first at 'encoder' (max \\|diff\\| 0.3) |")
    assert text[5] == ("| maxvit | - | - | - | no | no | - | - | 300 | - "
                       "| stopped: over the time limit (300 CPU s) while in translate |")
    assert len(text) == 2 + len(RECORDS)
    assert "| torchax |" not in table.markdown(RECORDS)


def test_the_failures_are_grouped_by_the_step_they_failed_at_in_step_order():
    assert table.failures(RECORDS) == (
        "- **build** (1):\n"
        "  - `blip`: not built: RuntimeError: no input\n"
        "- **export** (1):\n"
        "  - `longformer`: torch.export: GuardOnDataDependentSymNode: Could not guard \\| on data\n"
        "- **translate** (1):\n"
        "  - `maxvit`: stopped: over the time limit (300 CPU s) while in translate\n"
        "- **proof** (1):\n"
        "  - `swin`: float64 proof fails first at 'encoder' (max \\|diff\\| 0.3)\n")
    assert table.failures(RECORDS[:1]) == "Every case proves.\n"


def test_a_filter_is_comma_separated_regular_expressions_each_searched_in_the_name():
    names = ["bert", "albert", "vit", "vit_mae", "gpt2"]
    assert runner.select(names, "^bert$,vit") == ["bert", "vit", "vit_mae"]
    assert runner.select(names, "bert") == ["bert", "albert"]
    assert runner.select(names, None) == names == runner.select(names, " , ")


@pytest.mark.torch
def test_written_files_of_a_forward_that_draws_are_checked_with_torchs_draws():
    """A forward that draws in eval mode too (randn_like, F.dropout(training=True), SDPA's dropout_p):
    model.py takes torch's draws and masks, so its float32 output equals torch's; a file that drew
    its own would be off by the size of the values."""
    import torch
    from torch.nn import functional as F

    from flaxport.bench.coverage.case import check_sample

    class Noisy(torch.nn.Module):
        def forward(self, q, k, v):
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
            return F.dropout(attended, 0.3, training=True) + torch.randn_like(q)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    out = check_sample(Noisy(), (q, k, v), {}, {}, lambda step: None)
    assert out["step"] == "" and out["proof"], out
    assert out["float32"] < 1e-5


@pytest.mark.torch
@pytest.mark.parametrize("output", ["item", "complex", "nan", "empty"])
def test_written_files_returning_a_number_or_complex_values_are_compared_whole(output):
    """torch returns .item() as a Python number (model.py an array), and a complex tensor's imaginary
    part counts: each is compared, not dropped or counted as an output torch lacks. NaN where torch
    has NaN is the op's answer; torch.empty's values are nothing to compare."""
    import torch

    from flaxport.bench.coverage.case import check_sample

    class Out(torch.nn.Module):
        def forward(self, x):
            if output == "nan":
                return x.var(dim=-1, keepdim=True)[..., :1, :].var(dim=-2), x * 2  # variance of one value
            if output == "empty":
                return torch.empty(x.shape[0], 5), x + 1
            return x.sum().item() if output == "item" else torch.view_as_complex(x) * 2

    out = check_sample(Out(), (torch.randn(3, 4, 2),), {}, {}, lambda step: None)
    assert out["step"] == "" and out["proof"], out
    assert out["float32"] < 1e-5


@pytest.mark.torch
def test_speed_times_a_proved_classifier_and_the_table_shows_it():
    """--speed: the translated forward and train step against torch eager, as ratios in the record
    and two columns of the case table; a model that is not a classifier gets no step figure."""
    import torch

    from flaxport.bench.coverage.case import check_sample, summarize

    torch.manual_seed(0)
    classifier = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    sample = check_sample(classifier, (torch.randn(2, 4),), {}, {}, lambda step: None, speed=True)
    assert sample["proof"] and set(sample["speed"]) == {"forward", "step"}, sample
    assert all(0 < sample["speed"][part] < 1000 for part in ("forward", "step"))
    record = {"name": "mlp", "seconds": 1.0, **summarize([sample])}
    row = table.markdown([record], speed=True).splitlines()[2]
    assert f"| {sample['speed']['forward']:.2f}x | {sample['speed']['step']:.2f}x |" in row
    pooled = check_sample(torch.nn.AdaptiveAvgPool2d(1).eval(), (torch.randn(2, 3, 4, 4),), {}, {},
                          lambda step: None, speed=True)
    assert pooled["speed"]["step"] is None and pooled["speed"]["forward"] > 0

    class AuxiliaryInTraining(torch.nn.Module):  # GoogLeNet's way: more logits in train mode
        def __init__(self):
            super().__init__()
            self.head, self.aux = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

        def forward(self, x):
            return (self.head(x), self.aux(x)) if self.training else self.head(x)

    aux = check_sample(AuxiliaryInTraining().eval(), (torch.randn(2, 4),), {}, {}, lambda step: None, speed=True)
    assert aux["proof"] and aux["speed"]["step"] is None and aux["speed"]["forward"] > 0, aux


def test_the_speed_summary_gives_median_largest_and_the_cases_slower_than_torch():
    def record(name, forward, step=None, error=None):
        speed = {"error": error} if error else {"forward": forward, "step": step}
        return {"name": name, "proof": True, "seconds": 1.0, "speed": speed}

    records = [record("a", 0.5, 0.9), record("b", 1.2, None), record("c", 0.8, 1.1), record("d", None, error="stopped"),
               {"name": "e", "proof": False, "step": "proof", "reason": "diverges", "seconds": 1.0}]
    lines = table.speeds(records).splitlines()
    assert lines[0] == "- translated forward / torch eager's: median 0.80x over 3 cases, largest 1.20x (`b`), 1 above 1.0x"
    assert lines[1] == "- translated train step / torch eager's: median 1.00x over 2 cases, largest 1.10x (`c`), 1 above 1.0x"
    assert "`d`" in lines[2] and len(lines) == 3
    rows = table.markdown(records, speed=True).splitlines()
    assert rows[5].endswith("| - | - | not timed: stopped |") and rows[6].endswith("| diverges |")
    assert table.speeds([records[-1]]) == "No case was timed.\n"


@pytest.mark.torch
def test_a_sample_torch_itself_cannot_run_is_not_built_and_does_not_count():
    import torch

    from flaxport.bench.coverage.case import check_sample, summarize

    class Strict(torch.nn.Module):
        def forward(self, x):
            return x.view(3, 5)  # the sample below has 12 values

    bad = check_sample(Strict(), (torch.randn(3, 4),), {}, {}, lambda step: None)
    assert bad["step"] == "build" and bad["reason"].startswith("not built: torch's own forward fails on it: ")
    good = check_sample(Strict(), (torch.randn(15),), {}, {}, lambda step: None)
    assert good["proof"], good
    assert summarize([good, bad])["proof"] and summarize([bad])["step"] == "build"


def test_resume_with_another_filter_keeps_every_record_the_file_holds(zoo, tmp_path, capsys):
    """Cases run one --filter at a time into one file: each resumed run adds its own records."""
    out = tmp_path / "zoo.jsonl"
    assert main(["--source", zoo, "--filter", "^broken$", "--json", str(out), "--resume"]) == 0
    assert main(["--source", zoo, "--filter", "^crash$", "--json", str(out), "--resume"]) == 0
    lines = out.read_text().splitlines()
    assert "run" in json.loads(lines[0]) and [json.loads(line)["name"] for line in lines[1:]] == ["broken", "crash"]
    assert main(["--source", zoo, "--filter", "^(broken|crash)$", "--json", str(out), "--resume"]) == 0
    assert len(out.read_text().splitlines()) == 3  # nothing run again
    capsys.readouterr()
