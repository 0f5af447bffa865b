"""Plots for the reports (matplotlib, headless). Each returns PNG bytes, or None if it has no data.

matplotlib is optional (``pip install 'spectest[report]'``): :func:`available` says whether it is
installed, and the report degrades to tables without it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

OUTCOME_COLOURS = {"passed": "#4caf50", "failed": "#e53935", "error": "#8e24aa", "skipped": "#bdbdbd"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(draw: Callable[[Any, Any], None], size: tuple[float, float] = (7.0, 4.0)) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=size, dpi=100)
    try:
        draw(fig, ax)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def verdict_table(tests: list[dict[str, Any]]) -> bytes | None:
    if not tests:
        return None
    models = sorted({t["model"] for t in tests})
    properties = sorted({t["property"] for t in tests})
    outcome = {(t["model"], t["property"]): t["outcome"] for t in tests}

    def draw(fig: Any, ax: Any) -> None:
        for i, model in enumerate(models):
            for j, prop in enumerate(properties):
                state = outcome.get((model, prop), "skipped")
                ax.add_patch(_rectangle(j, i, OUTCOME_COLOURS.get(state, "#ffffff")))
                ax.text(j + 0.5, i + 0.5, state, ha="center", va="center", fontsize=7)
        ax.set_xlim(0, len(properties))
        ax.set_ylim(0, len(models))
        ax.set_xticks(
            [j + 0.5 for j in range(len(properties))],
            [p.removeprefix("test_") for p in properties],
            rotation=35,
            ha="right",
            fontsize=7,
        )
        ax.set_yticks([i + 0.5 for i in range(len(models))], models, fontsize=7)
        ax.set_title("verdict per model and property")

    return _figure(draw, (8.0, 1.2 + 0.45 * len(models) + 1.5))


def _rectangle(x: float, y: float, colour: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white")


def failing_cells(check: dict[str, Any]) -> bytes | None:
    cells = check.get("worst_cells") or []
    if not cells:
        return None

    def draw(fig: Any, ax: Any) -> None:
        labels = [str(c[0])[-40:] for c in cells]
        positions = range(len(cells))
        ax.barh([p + 0.2 for p in positions], [c[1] for c in cells], height=0.4, label="expected", color="#90caf9")
        ax.barh([p - 0.2 for p in positions], [c[2] for c in cells], height=0.4, label="observed", color="#e53935")
        ax.set_yticks(list(positions), labels, fontsize=7)
        ax.set_xlabel("count")
        ax.legend()
        ax.set_title(f"{check['model']}: {check['check']}"[:90], fontsize=9)

    return _figure(draw, (7.5, 1.5 + 0.5 * len(cells)))


def efficiency(figures: list[dict[str, Any]]) -> bytes | None:
    rows = [(f["model"], f["efficiency"]) for f in figures if isinstance(f.get("efficiency"), (int, float))]
    if not rows:
        return None
    models = sorted({m for m, _ in rows})

    def draw(fig: Any, ax: Any) -> None:
        for i, model in enumerate(models):
            values = [e for m, e in rows if m == model]
            ax.scatter(values, [i] * len(values), alpha=0.7)
        ax.axvline(1.0, color="black", linestyle="--", label="standard rejection sampling (optimum per token)")
        ax.set_yticks(range(len(models)), models, fontsize=7)
        ax.set_xlabel("measured acceptance / optimum (efficiency)")
        ax.legend(fontsize=7)
        ax.set_title("acceptance against the optimum")

    return _figure(draw, (7.0, 1.8 + 0.4 * len(models)))


def loss_against_speed(figures: list[dict[str, Any]]) -> bytes | None:
    """Lossy mode: each case's measured TV per position (mean over rows and positions, with its
    simultaneous interval) against its tokens per call relative to standard rejection sampling."""
    records = [f for f in figures if f.get("measured_tv") and f.get("optimal_tokens_per_call")]
    if not records:
        return None
    models = sorted({f["model"] for f in records})

    def draw(fig: Any, ax: Any) -> None:
        for i, model in enumerate(models):
            mine = [f for f in records if f["model"] == model]
            x = [f["tokens_per_call"] / f["optimal_tokens_per_call"] for f in mine]
            y = [f["measured_tv"]["mean_estimate"] for f in mine]
            low = [max(0.0, v - f["measured_tv"]["mean_interval"][0]) for v, f in zip(y, mine, strict=True)]
            high = [max(0.0, f["measured_tv"]["mean_interval"][1] - v) for v, f in zip(y, mine, strict=True)]
            ax.errorbar(x, y, yerr=[low, high], fmt="o", color=f"C{i}", alpha=0.7, capsize=2, label=model)
        ax.scatter([1.0], [0.0], marker="*", s=120, color="black", label="lossless, standard rejection sampling")
        ax.set_xlabel("tokens per call / standard rejection sampling's on the same inputs")
        ax.set_ylabel("TV distance to the target per position")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        ax.set_title("TV lost against tokens per call bought (one point per case)")

    return _figure(draw)


def per_position_acceptance(figures: list[dict[str, Any]]) -> bytes | None:
    records = [f for f in figures if f.get("prefix_acceptance")]
    if not records:
        return None
    models = sorted({f["model"] for f in records})

    def draw(fig: Any, ax: Any) -> None:
        colours = {model: f"C{i}" for i, model in enumerate(models)}
        for record in records:
            positions = range(1, len(record["prefix_acceptance"]) + 1)
            colour = colours[record["model"]]
            ax.plot(positions, record["prefix_acceptance"], "o-", color=colour, alpha=0.6)
            ax.plot(positions, record["prefix_acceptance_optimal"], "x:", color=colour, alpha=0.6)
        for model in models:
            ax.plot([], [], "o-", color=colours[model], label=f"{model} measured")
        ax.plot([], [], "kx:", label="standard rejection sampling (optimum)")
        ax.set_xlabel("draft position j")
        ax.set_ylabel("P(first j drafts accepted)")
        ax.legend(fontsize=7)
        ax.set_title("per-position acceptance against the optimum (one line per case)")

    return _figure(draw)


def _speed_records(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in figures if f.get("speed_points")]


def speedup_curve(figures: list[dict[str, Any]]) -> bytes | None:
    records = _speed_records(figures)
    if not records:
        return None
    from spectest.simulators import CostModel, speedup

    def draw(fig: Any, ax: Any) -> None:
        for record in records:
            points = record["speed_points"]
            k = record.get("k", 4)
            ax.scatter(
                [p["acceptance"] for p in points], [p["measured"] for p in points], label=f"{record['model']} measured"
            )
            grid = [i / 100 for i in range(101)]
            if record.get("costs"):
                model = CostModel(**record["costs"])
                ax.plot(grid, [speedup(a, k, model) for a in grid], label=f"{record['model']} model, efficient pass")
            if record.get("own_costs"):
                own = CostModel(**record["own_costs"])
                ax.plot(
                    grid,
                    [speedup(a, k, own) for a in grid],
                    linestyle="--",
                    label=f"{record['model']} model, own costs",
                )
            if record.get("break_even_predicted") is not None:
                ax.axvline(record["break_even_predicted"], linestyle=":", color="grey", label="predicted break-even a*")
            if record.get("break_even_measured") is not None:
                ax.axvline(record["break_even_measured"], linestyle="--", color="black", label="measured crossing")
        ax.axhline(1.0, color="red", linewidth=0.8)
        ax.set_xlabel("acceptance rate a")
        ax.set_ylabel("speedup over plain decoding")
        ax.legend(fontsize=7)
        ax.set_title("speedup against acceptance")

    return _figure(draw)


def tokens_per_pass(figures: list[dict[str, Any]]) -> bytes | None:
    records = [(f, p) for f in _speed_records(figures) for p in f["speed_points"] if p.get("counts")]
    if not records:
        return None

    def draw(fig: Any, ax: Any) -> None:
        width = 0.8 / max(1, len(records))
        for i, (_, point) in enumerate(records):
            counts = point["counts"]
            total = sum(counts) or 1
            xs = [value + 1 + i * width for value in range(len(counts))]
            ax.bar(
                xs, [c / total for c in counts], width=width, alpha=0.6, label=f"a={point['acceptance']:.2f} measured"
            )
            ax.plot(xs, point["model_probs"], "k.", markersize=6)
        ax.set_xlabel("tokens per pass L (dots: analytic model)")
        ax.set_ylabel("fraction of passes")
        ax.legend(fontsize=6, ncol=2)
        ax.set_title("tokens per pass against the analytic model")

    return _figure(draw)


def break_even_table(k_max: int = 8) -> bytes | None:
    from spectest.simulators import CostModel, break_even_acceptance

    ratios = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75)

    def draw(fig: Any, ax: Any) -> None:
        grid = [[break_even_acceptance(k, CostModel(c)) or 1.0 for c in ratios] for k in range(1, k_max + 1)]
        image = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=0, vmax=1)
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(ratios)), [str(c) for c in ratios])
        ax.set_yticks(range(k_max), [str(k) for k in range(1, k_max + 1)])
        ax.set_xlabel("draft/target cost ratio c")
        ax.set_ylabel("K")
        fig.colorbar(image, ax=ax, label="break-even acceptance a*")
        ax.set_title("break-even acceptance (d = 0, no overhead)")

    return _figure(draw)


def plot_profiles(profiles: list[Any], document: dict[str, Any], path: Any) -> None:
    """Acceptance along each profiled text (raw and a 64-token moving average), the break-even
    acceptance, and the stretches below it shaded; one panel per text, written to ``path``."""
    if not available():
        raise OSError("--plot needs matplotlib: pip install -e '.[report]'")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from spectest.profiler.acceptance import below_stretches, moving_average

    fig, axes = plt.subplots(len(profiles), 1, figsize=(9, 2.2 * len(profiles) + 0.6), dpi=100, squeeze=False)
    try:
        for ax, profile, row in zip(axes[:, 0], profiles, document["files"], strict=True):
            ax.plot(profile.acceptance, color="#90caf9", linewidth=0.5, label="a_t = sum min(p, q)")
            ax.plot(moving_average(profile.acceptance), color="#1565c0", linewidth=1.5, label="64-token average")
            threshold = row["break_even_acceptance"]
            if threshold is not None:
                ax.axhline(threshold, color="#e53935", linestyle="--", linewidth=1, label="break-even")
                for start, end in below_stretches(profile.acceptance, threshold):
                    ax.axvspan(start, end, color="#ffcdd2", alpha=0.6, linewidth=0)
            ax.set_ylim(0, 1.02)
            ax.set_ylabel("acceptance")
            ax.set_title(
                f"{profile.name} ({profile.label}): mean {row['mean_acceptance']:.3f}, "
                f"predicted speedup {row['speedup']:.2f}x",
                fontsize=9,
            )
        axes[-1, 0].set_xlabel("token position")
        axes[0, 0].legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def pit_histograms(figures: list[dict[str, Any]]) -> bytes | None:
    """End to end: each engine's PIT by token id, one line per group, against the uniform it must follow."""
    records = [(f, name, h) for f in figures for name, h in (f.get("pit") or {}).items() if "token id" in name]
    if not records:
        return None

    def draw(fig: Any, ax: Any) -> None:
        for record, name, histogram in records[:6]:
            counts = histogram["counts"]
            bins = len(counts[0])
            for label, row in zip(histogram["groups"], counts, strict=True):
                total = sum(row)
                if total:
                    ax.step(
                        [(i + 0.5) / bins for i in range(bins)],
                        [c * bins / total for c in row],
                        where="mid",
                        label=f"{record['model']} {'offset' if 'offset' in name else ''} {label} (n={total})",
                    )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("PIT value (by token id)")
        ax.set_ylabel("density (uniform = 1)")
        ax.set_title("End to end: probability integral transform of every sampled token")
        ax.legend(fontsize=6, ncol=2)

    return _figure(draw, size=(7.0, 4.5))


def acceptance_by_position(figures: list[dict[str, Any]]) -> bytes | None:
    """End to end: mean acceptance sum_x min(p_t, q_t) at each position of the engine's output."""
    records = [f for f in figures if f.get("acceptance_by_position")]
    if not records:
        return None

    def draw(fig: Any, ax: Any) -> None:
        for record in records:
            points = sorted((int(t), a) for t, a in record["acceptance_by_position"].items())
            ax.plot(
                [t for t, _ in points], [a for _, a in points], marker="o", label=f"{record['model']}: {record['e2e']}"
            )
        ax.set_ylim(0, 1)
        ax.set_xlabel("position in the generation")
        ax.set_ylabel("acceptance sum min(p, q)")
        ax.set_title("End to end: measured acceptance along the engine's own contexts")
        ax.legend(fontsize=6)

    return _figure(draw)


def e2e_speedup(figures: list[dict[str, Any]], margin: float = 1.1) -> bytes | None:
    """End to end: each round's measured speedup against the one the model predicts from the engine's
    acceptance and its measured parts; the property fails when most rounds fall below the 1/margin line."""
    records = [f for f in figures if f.get("e2e_speed")]
    if not records:
        return None

    def draw(fig: Any, ax: Any) -> None:
        values = []
        for record in records:
            speed = record["e2e_speed"]
            values += speed["measured"] + speed["predicted"]
            ax.scatter(speed["predicted"], speed["measured"], label=f"{record['model']} (K={speed['k']})")
        low, high = 0.9 * min(values), 1.1 * max(values)
        ax.plot([low, high], [low, high], color="black", linewidth=0.8, label="measured = predicted")
        ax.plot([low, high], [low / margin, high / margin], color="red", linestyle=":", label=f"predicted / {margin:g}")
        if low <= 1.0 <= high:
            ax.axhline(1.0, color="grey", linewidth=0.6, label="plain decoding")
        ax.set_xlabel("predicted speedup (from acceptance and measured parts)")
        ax.set_ylabel("measured speedup")
        ax.set_title("End to end: measured against predicted speedup, per round")
        ax.legend(fontsize=6)

    return _figure(draw)
