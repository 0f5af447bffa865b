"""Render a results document to a self-contained HTML report and a Markdown summary.

HTML embeds its plots as base64 PNGs (no network needed to view it) and escapes everything that
comes from the user or an implementation (model names, paths, exception text).
"""

from __future__ import annotations

import base64
import html
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from spectest.reporting import plots


def _counts(tests: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    per_model: dict[str, Counter[str]] = defaultdict(Counter)
    for test in tests:
        per_model[test["model"]][test["outcome"]] += 1
    return per_model


def _plots(document: dict[str, Any]) -> list[tuple[str, bytes]]:
    if not plots.available():
        return []
    made: list[tuple[str, bytes | None]] = [
        ("Verdicts", plots.verdict_table(document["tests"])),
        ("Acceptance against the optimum", plots.efficiency(document["figures"])),
        ("Per-position acceptance against the optimum", plots.per_position_acceptance(document["figures"])),
        ("Loss against speed (lossy mode)", plots.loss_against_speed(document["figures"])),
        ("Tokens per pass against the model", plots.tokens_per_pass(document["figures"])),
        ("Speedup against acceptance", plots.speedup_curve(document["figures"])),
        ("End to end: PIT of the engine's tokens", plots.pit_histograms(document["figures"])),
        ("End to end: acceptance by position", plots.acceptance_by_position(document["figures"])),
        ("End to end: measured against predicted speedup", plots.e2e_speedup(document["figures"])),
        ("Break-even acceptance", plots.break_even_table()),
    ]
    failing = [c for c in document["checks"] if not c.get("passed", True)]
    made += [(f"Failing check: {c['model']} / {c['property']}", plots.failing_cells(c)) for c in failing[:10]]
    return [(title, png) for title, png in made if png is not None]


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "" if value is None else format(value, spec) if isinstance(value, (int, float)) else str(value)


def to_html(document: dict[str, Any], images: list[tuple[str, bytes]]) -> str:
    env = document["environment"]
    summary_rows = [
        [model, c["passed"], c["failed"] + c["error"], c["skipped"]]
        for model, c in sorted(_counts(document["tests"]).items())
    ]
    check_rows = [
        [
            c["model"],
            c["property"],
            c["check"],
            "pass" if c["passed"] else "FAIL",
            _fmt(c["p_value"]),
            c["n"],
            _fmt(c["min_detectable_tv"]),
            f"{_fmt(c['observed_tv'])} [{_fmt(c['tv_interval'][0])}, {_fmt(c['tv_interval'][1])}]",
            "yes" if c.get("stopped_early") else "",
            _fmt(c.get("duration_s"), ".2f"),
        ]
        for c in document["checks"]
    ]
    failures = "".join(
        f"<h3>{html.escape(t['model'])} / {html.escape(t['property'])}: {html.escape(t['outcome'])}</h3>"
        f"<pre>{html.escape(t['message'])}</pre>"
        for t in document["tests"]
        if t["outcome"] in ("failed", "error")
    )
    if images:
        figures = "".join(
            f"<figure><img alt='{html.escape(title, quote=True)}' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode()}'><figcaption>{html.escape(title)}</figcaption></figure>"
            for title, png in images
        )
    else:
        figures = "<p class='note'>Plots unavailable: matplotlib is not installed (pip install 'spectest[report]').</p>"
    env_rows = [[key, value] for key, value in env.items() if key != "packages"]
    env_rows += [[f"package {name}", version or "not installed"] for name, version in env["packages"].items()]
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}img{max-width:100%}.note{color:#a00}"
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>spectest report</title>"
        f"<style>{style}</style></head><body><h1>spectest report</h1>"
        f"<h2>Summary</h2>{_table(['model', 'passed', 'failed', 'skipped'], summary_rows)}"
        f"<h2>Plots</h2>{figures}"
        f"<h2>Failures</h2>{failures or '<p>None.</p>'}"
        "<h2>Distribution checks</h2><p>p: the smallest p-value over the pooling views, multiplied by their number"
        " (Bonferroni) and capped at 1, so many read 1.0; a check fails when it is below its level.</p>"
        + _table(
            [
                "model",
                "property",
                "check",
                "verdict",
                "p (x views, capped at 1)",
                "n",
                "min detectable TV",
                "TV [95% CI]",
                "early stop",
                "s",
            ],
            check_rows,
        )
        + f"<h2>Environment</h2>{_table(['', ''], env_rows)}</body></html>"
    )


def _md_cell(value: Any) -> str:
    """Text from a user or an implementation, inert in a Markdown table: HTML escaped (GitHub renders
    tags in Markdown), pipes and backticks neutralised, one line."""
    text = html.escape(str(value).replace("\n", " "), quote=False)
    return text.replace("|", "\\|").replace("`", "\\`")


def to_markdown(document: dict[str, Any]) -> str:
    env = document["environment"]
    lines = [
        "## spectest",
        "",
        f"seed `{env['seed']}`, alpha {env['alpha']}, budget {env['budget']}, tolerance TV {env['tolerance']}, "
        f"device {env['device']}, commit `{env.get('git_commit') or 'n/a'}`",
        "",
        "| model | passed | failed | skipped |",
        "| --- | --- | --- | --- |",
    ]
    for model, c in sorted(_counts(document["tests"]).items()):
        lines.append(f"| {_md_cell(model)} | {c['passed']} | {c['failed'] + c['error']} | {c['skipped']} |")
    failing = [t for t in document["tests"] if t["outcome"] in ("failed", "error")]
    if failing:
        lines += ["", "### Failures", ""]
        for t in failing:
            first = next(
                (line for line in t["message"].splitlines() if "broke rule" in line or "not distributed" in line), ""
            )
            lines.append(f"- **{_md_cell(t['model'])}** `{t['property']}`: {_md_cell(first.strip()[:300])}")
    checks = document["checks"]
    if checks:
        detectable = sorted(c["min_detectable_tv"] for c in checks)
        lines += [
            "",
            f"{len(checks)} distribution checks on {sum(c['n'] for c in checks)} emitted tokens; "
            f"median minimum detectable TV {detectable[len(detectable) // 2]:.3f} at power 0.99.",
        ]
    return "\n".join(lines) + "\n"


def render(document: dict[str, Any], directory: Path) -> list[Path]:
    """Write report.html and summary.md next to the results file; return what was written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    page, summary = directory / "report.html", directory / "summary.md"
    page.write_text(to_html(document, _plots(document)))
    summary.write_text(to_markdown(document))
    return [page, summary]


def compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """Markdown table putting two runs side by side per (model, property)."""

    def index(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        table: dict[tuple[str, str], dict[str, Any]] = {}
        for test in doc["tests"]:
            table[(test["model"], test["property"])] = {"outcome": test["outcome"]}
        for check in doc["checks"]:
            row = table.setdefault((check["model"], check["property"]), {"outcome": "?"})
            row["p"] = min(row.get("p", 1.0), check["p_value"])
            row["mde"] = max(row.get("mde", 0.0), check["min_detectable_tv"])
        return table

    left, right = index(a), index(b)
    lines = [
        f"| model | property | {names[0]} | {names[1]} | min p {names[0]} | min p {names[1]} | "
        f"weakest MDE {names[0]} | weakest MDE {names[1]} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(set(left) | set(right)):
        one, two = left.get(key, {}), right.get(key, {})
        changed = " **changed**" if one.get("outcome") != two.get("outcome") else ""
        lines.append(
            f"| {_md_cell(key[0])} | {key[1]} | {one.get('outcome', '-')} | {two.get('outcome', '-')}{changed} | "
            f"{_fmt(one.get('p'))} | {_fmt(two.get('p'))} | {_fmt(one.get('mde'))} | {_fmt(two.get('mde'))} |"
        )
    return "\n".join(lines) + "\n"
