"""The ``spectest`` section of pytest's terminal summary: what the run promised and what it did."""

from __future__ import annotations

import statistics
from typing import Any

from spectest.session import SpecSession


def checks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "check"]


def figures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "figure"]


def lossy_lines(session: SpecSession) -> list[str]:
    """Per lossy model: the TV it showed per position and the tokens per call it bought."""
    lines = []
    for model in session.checks_per_model:
        cases = [r for r in figures(session.records) if r["model"] == model and r.get("measured_tv")]
        if not cases:
            continue
        tv = [r["measured_tv"]["mean_estimate"] for r in cases]
        speed = [r["tokens_per_call"] / r["optimal_tokens_per_call"] for r in cases]
        worst = max(cases, key=lambda r: r["measured_tv"]["worst_interval"][0])["measured_tv"]
        lines.append(
            f"{model}: lossy: TV to the target per position, mean over rows and positions: median {statistics.median(tv):.3f} "
            f"over {len(cases)} cases (plug-in; worst group's simultaneous interval "
            f"[{worst['worst_interval'][0]:.3f}, {worst['worst_interval'][1]:.3f}]); tokens per call x"
            f"{statistics.median(speed):.3f} of standard rejection sampling's (median)"
        )
    return lines


def summary_lines(session: SpecSession) -> list[str]:
    lines = session.split_lines()
    shown = figures(session.records)
    for model in session.checks_per_model:
        efficiency = [r["efficiency"] for r in shown if r["model"] == model and "efficiency" in r]
        if efficiency:
            lines.append(
                f"{model}: acceptance efficiency vs standard rejection sampling: median "
                f"{statistics.median(efficiency):.3f} (min {min(efficiency):.3f}, max {max(efficiency):.3f}) over "
                f"{len(efficiency)} cases"
            )
    lines += lossy_lines(session)
    statistical = [r for r in checks(session.records) if r["df"] > 0]
    if statistical:
        failed = [r for r in statistical if not r["passed"]]
        early = sum(bool(r.get("stopped_early")) for r in statistical)
        lines.append(
            f"{len(statistical)} distribution checks on {sum(int(r['n']) for r in statistical)} emitted tokens, "
            f"{len(failed)} failed ({early} stopped early); median minimum detectable TV "
            f"{statistics.median(r['min_detectable_tv'] for r in statistical):.3f} at power 0.99"
        )
        limited = [r for r in statistical if r.get("time_limited")]
        if limited:
            lines.append(
                f"{len(limited)} checks ran below plan on {', '.join(sorted({r['model'] for r in limited}))}: the "
                f"implementation's own time in its calls reached its budget (--spec-run-seconds "
                f"{session.run_seconds:g} per model, shared by planned checks); they drew "
                f"{sum(r['draws'] for r in limited)} of {sum(r['planned_draws'] for r in limited)} planned draws, and "
                f"can detect a TV of {statistics.median(r['min_detectable_tv'] for r in limited):.3f} (median) "
                f"instead of {session.tolerance:g}"
            )
    timings = [r["timing"] for r in shown if "timing" in r]
    if timings:
        total = {key: sum(t[key] for t in timings) for key in ("inputs_s", "calls_s", "statistics_s", "total_s")}
        lines.append(
            f"time in the properties ({total['total_s']:.1f} s of CPU): implementation calls "
            f"{total['calls_s']:.1f} s, generating inputs {total['inputs_s']:.1f} s, statistics "
            f"{total['statistics_s']:.1f} s"
        )
    return lines
