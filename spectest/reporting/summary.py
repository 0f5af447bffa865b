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


def speed_lines(session: SpecSession) -> list[str]:
    """Per model that ran the speed property: how its speedup follows its own-cost model, and how
    far its passes are from an efficient pass (measured always, gated only on request)."""
    lines = []
    for record in figures(session.records):
        if not record.get("speed_points") or "speed_efficiency" not in record:
            continue
        agreement = [p["agreement"] for p in record["speed_points"] if p.get("agreement") is not None]
        best = record["speed_efficiency"]
        own, efficient = record.get("break_even_own"), record.get("break_even_predicted")
        gate = record.get("speed_gate")
        lines.append(
            f"{record['model']}: speed: measured speedup x{min(agreement):.3f} to x{max(agreement):.3f} of the model "
            f"with its own costs; x{best['pass_cost_ratio']:.2f} of an efficient pass; spec decoding pays "
            f"{best['speedup_measured']:.2f}x here instead of {best['speedup_efficient']:.2f}x (a = "
            f"{best['acceptance']:.2f}); break-even a* = {'never' if own is None else format(own, '.3f')} with its own "
            f"costs, {'never' if efficient is None else format(efficient, '.3f')} for an efficient pass"
            + (f"; efficiency gate x{gate:g}" if gate else " (efficiency not gated: --spec-speed-gate RATIO)")
        )
    return lines


def _speed_plan(speed: dict) -> str:
    """The clock and the sign test's plan and power, where the figure has them."""
    plan = speed.get("sign_test")
    if not plan:
        return ""
    return (
        f"; on {speed.get('clock', 'the own clock')}, failing at {plan['needed']} of {plan['rounds']} rounds short "
        f"(power {plan['power']:.2f} against rounds short 19 times in 20)"
    )


def e2e_lines(session: SpecSession) -> list[str]:
    """End to end: what each engine does not take, what its output checks could detect, and its speed against
    its model."""
    lines = [
        f"{engine.name}: {name} left out of every request: {why}"
        for engine in session.engines
        for name, why in engine.left_out
    ]
    for record in figures(session.records):
        speed = record.get("e2e_speed")
        if speed:
            measured, predicted = statistics.median(speed["measured"]), statistics.median(speed["predicted"])
            even = speed["break_even"]
            low, high = speed.get("measured_interval", (measured, measured))
            plow, phigh = speed.get("predicted_interval", (predicted, predicted))
            by_position = [round(a, 2) for a in speed.get("acceptance_by_position", {}).values()]
            lines.append(
                f"{record['model']}: end to end, K={speed['k']}, {speed['rounds']} rounds: speedup {measured:.3f}x "
                f"measured [{low:.3f}, {high:.3f}], {predicted:.3f}x predicted [{plow:.3f}, {phigh:.3f}] from its "
                f"acceptance and its parts; tokens per pass {statistics.median(speed['tokens_per_pass_measured']):.3f} "
                f"measured, {statistics.median(speed['tokens_per_pass_expected']):.3f} predicted; "
                f"{1e3 * statistics.median(speed['unexplained_per_pass_s']):.2f} ms per pass unexplained; break-even "
                f"acceptance {'never (a pass costs more than K + 1 plain steps)' if even is None else format(even, '.3f')}; "
                f"optimal K {speed.get('optimal_k') or 'none (no K beats plain decoding)'}; acceptance by position "
                f"{by_position}{_speed_plan(speed)}"
            )
        if record.get("acceptance_by_position"):
            values = list(record["acceptance_by_position"].values())
            lines.append(
                f"{record['model']}: end to end ({record['e2e']}): acceptance sum min(p, q) along its own contexts "
                f"{values[0]:.3f} at the first position, {values[-1]:.3f} at the last"
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
    lines += speed_lines(session)
    lines += e2e_lines(session)
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
                f"instead of {statistics.median(r.get('tolerance', session.tolerance) for r in limited):g}"
            )
    timings = [r["timing"] for r in shown if "timing" in r]
    if timings:
        keys = ("inputs_s", "calls_s", "statistics_s", "total_s", "scoring_s")
        total = {key: sum(t.get(key, 0.0) for t in timings) for key in keys}
        calls = f"implementation calls {total['calls_s']:.1f} s"
        if total["scoring_s"]:
            own = total["calls_s"] - total["scoring_s"]
            harness = total["inputs_s"] + total["statistics_s"] + total["scoring_s"]
            calls += (
                f" (generating {own:.1f} s, teacher forcing {total['scoring_s']:.1f} s: the harness's work, "
                f"teacher forcing included, is {harness / max(own, 1e-9):.2f}x the engine's generation)"
            )
        lines.append(
            f"time in the properties ({total['total_s']:.1f} s of CPU): {calls}, generating inputs "
            f"{total['inputs_s']:.1f} s, statistics {total['statistics_s']:.1f} s"
        )
    return lines
