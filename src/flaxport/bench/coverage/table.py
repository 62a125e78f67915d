"""The coverage benchmark's markdown: the summary, one row per case, and what fails with its reason.

Pure functions of the runner's records (case.py says what a record holds).
"""
from __future__ import annotations

import collections
import statistics

# the steps of a case in the order they run; a failed case is counted at the first that failed
STEPS = ("build", "export", "translate", "proof", "train", "files")


def counts(records: list) -> dict:
    """{cases, built, captured, translated, proved, eval_proved, peer (None when no peer ran)}: how many cases got
    through each step (a case stopped at a limit counts as far as it got)."""
    def passed(r, step):
        failed = r.get("step") or ""
        return not failed or (failed in STEPS and STEPS.index(failed) > STEPS.index(step))

    peers = [r["peer"] for r in records if r.get("peer")]
    return {"cases": len(records),
            "built": sum(passed(r, "build") for r in records),
            "captured": sum(passed(r, "export") for r in records),
            "translated": sum(passed(r, "translate") for r in records),
            "proved": sum(bool(r.get("proof")) for r in records),
            "eval_proved": sum(proved_in_eval_mode(r) for r in records),
            "peer": sum(bool(p.get("ok")) for p in peers) if peers else None}


def proved_in_eval_mode(record: dict) -> bool:
    """Proved, or translated with only the train-mode check failing (the float64 proof and the
    written files hold in eval mode): what the record's `failed` says; a record without it, only
    when proved."""
    return bool(record.get("proof")) or (bool(record.get("translated")) and "failed" in record
                                         and set(record["failed"]) == {"train"})


def summary(records_by_source: dict, peer: str | None = None) -> str:
    """One row per source: cases, built, captured by torch.export, translated, proved (and the peer's)."""
    head = ("| source | cases | built | captured (torch.export) | translated | proved | proved, of captured "
            "| proved in eval mode, of captured |")
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|"
    if peer:
        head, rule = head + f" {peer} |", rule + "---:|"
    lines = [head, rule]
    for source, records in records_by_source.items():
        c = counts(records)
        share = f"{100 * c['proved'] / c['captured']:.0f}%" if c["captured"] else "-"
        eval_share = f"{100 * c['eval_proved'] / c['captured']:.0f}% ({c['eval_proved']})" if c["captured"] else "-"
        row = (f"| {source} | {c['cases']} | {c['built']} | {c['captured']} | {c['translated']} | {c['proved']} "
               f"| {share} | {eval_share} |")
        if peer:
            row += f" {c['peer'] if c['peer'] is not None else '-'} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def markdown(records: list, peer: str | None = None, speed: bool = False) -> str:
    """One row per case: model, parameters, captured, translated, proved, largest float32 output
    difference of the written model.py, generated lines, seconds (and the peer's verdict; with
    `speed`, the translated forward's and train step's time as a multiple of torch eager's), reason."""
    head = "| case | model | parameters | captured | translated | proved | float32 diff | lines | s |"
    rule = "|---|---|---:|:-:|:-:|:-:|---:|---:|---:|"
    if peer:
        head, rule = head + f" {peer} |", rule + ":-:|"
    if speed:
        head, rule = head + " forward vs torch | step vs torch |", rule + "---:|---:|"
    lines = [head + " reason |", rule + "---|"]
    for r in records:
        row = (f"| {r['name']} | {_cell(r.get('model') or '-')} | {_count(r.get('parameters'))} | {_yes(r.get('export'))} "
               f"| {_yes(r.get('translated'))} | {_yes(r.get('proof'))} | {_figure(r.get('float32'))} "
               f"| {r.get('lines') or '-'} | {r.get('seconds', 0):.0f} |")
        if peer:
            row += f" {_yes(r['peer']['ok']) if r.get('peer') else '-'} |"
        if speed:
            row += " " + " | ".join(_ratio((r.get("speed") or {}).get(part)) for part in ("forward", "step")) + " |"
        lines.append(row + f" {_cell(_reason(r))} |")
    return "\n".join(lines) + "\n"


def speeds(records: list) -> str:
    """The --speed figures in a few lines: per part (forward, train step), the median and the
    largest ratio to torch eager over the cases timed, and how many are slower than torch."""
    lines = []
    for part, what in (("forward", "forward"), ("step", "train step")):
        timed = [(r["speed"][part], r["name"]) for r in records if (r.get("speed") or {}).get(part) is not None]
        if timed:
            worst = max(timed)
            slower = sum(ratio > 1.0 for ratio, _ in timed)
            lines.append(f"- translated {what} / torch eager's: median {statistics.median(x for x, _ in timed):.2f}x "
                         f"over {len(timed)} cases, largest {worst[0]:.2f}x (`{worst[1]}`), {slower} above 1.0x")
    untimed = [r["name"] for r in records if r.get("proof") and (r.get("speed") or {}).get("error")]
    if untimed:
        lines.append(f"- proved but not timed: {', '.join(f'`{n}`' for n in untimed)} (the reason column says why)")
    return "\n".join(lines) + "\n" if lines else "No case was timed.\n"


def failures(records: list) -> str:
    """What does not pass, grouped by the step it failed at, one line per case with its reason."""
    by_step = collections.defaultdict(list)
    for r in records:
        if not r.get("proof"):
            by_step[r.get("step") or "?"].append(r)
    lines = []
    for step in sorted(by_step, key=lambda s: STEPS.index(s) if s in STEPS else len(STEPS)):
        cases = by_step[step]
        lines.append(f"- **{step}** ({len(cases)}):")
        lines += [f"  - `{r['name']}`: {_cell(_reason(r))}" for r in cases]
    return "\n".join(lines) + "\n" if lines else "Every case proves.\n"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _reason(r) -> str:
    timing = (r.get("speed") or {}).get("error")
    return r.get("reason") or (f"not timed: {timing}" if timing else "" if r.get("proof") else "-")


def _yes(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _figure(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def _count(n) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e3 else str(n)


def _cell(text) -> str:
    """Text fit for a table cell: one line, no pipes, at most 200 characters."""
    text = " ".join(str(text or "").split()).replace("|", "\\|")
    return text if len(text) <= 200 else text[:197] + "..."
