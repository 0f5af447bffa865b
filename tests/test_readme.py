"""Figures the README states that the code can produce are produced here, so they cannot drift."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from spectest.options import BUDGETS, DEFAULT_ALPHA, OPTIONS
from spectest.resolve import resolve_model
from spectest.session import MARKER, planned_checks

REPO = Path(__file__).resolve().parent.parent
REFERENCE_CAPABILITIES = resolve_model("reference").capabilities  # the README's main job
README = (REPO / "README.md").read_text()
MODULES = [
    "test_exactness",
    "test_rejection_chain",
    "test_hygiene",
    "test_acceptance",
    "test_sampling_params",
    "test_speed",
    "test_trees",
]


def properties() -> list:
    functions = []
    for name in MODULES:
        module = importlib.import_module(f"spectest.properties.{name}")
        functions += [f for f in vars(module).values() if callable(f) and getattr(f, "pytestmark", None)]
    return [f for f in functions if any(m.name == MARKER for m in f.pytestmark)]


def checks_per_model(budget: str) -> int:
    """What the plugin splits --spec-alpha over for one model running the whole suite."""
    total = 0
    for function in properties():
        marker = next(m for m in function.pytestmark if m.name == MARKER)
        total += planned_checks(marker.kwargs, BUDGETS[budget], REFERENCE_CAPABILITIES)
    return total


def budget_row(name: str) -> str:
    budget, checks = BUDGETS[name], checks_per_model(name)
    return f"| `{name}` | x{budget.examples:g} | TV {budget.tolerance:g} | {checks} | {DEFAULT_ALPHA / checks:.3g} |"


@pytest.mark.parametrize("flag", [flag for flag, _, _, _ in OPTIONS])
def test_readme_options_table_lists_every_option_with_its_default(flag):
    ini, help_text = next((ini, help_text) for f, ini, help_text, _ in OPTIONS if f == flag)
    rows = [line for line in README.splitlines() if line.startswith(f"| `{flag} ")]
    assert rows, f"the README's options table has no row for {flag}"
    assert f"| `{ini}`" in rows[0], f"the README's row for {flag} should name the ini key {ini}: {rows[0]}"
    number = r"default `?([0-9][0-9.e+-]*)"
    if said := re.search(number, help_text):
        written = re.search(number, rows[0])
        assert written and float(written.group(1)) == float(said.group(1)), (
            f"--help gives {flag} the default {said.group(1)}; the README's row says: {rows[0]}"
        )


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_readme_states_each_budgets_checks_and_per_check_level(name):
    assert budget_row(name) in README, f"the README's budget table should have the row\n{budget_row(name)}"


def test_readme_states_each_propertys_case_ranges():
    from spectest.properties import (
        test_acceptance,
        test_exactness,
        test_hygiene,
        test_rejection_chain,
        test_sampling_params,
    )

    ranges = {
        "test_every_row_and_position_is_exact": test_exactness.POSITIONS,
        "test_rejection_discards_every_later_position": test_rejection_chain.REJECTIONS,
        "test_all_accepted_then_bonus_from_its_own_row": test_rejection_chain.BONUSES,
        "test_same_generator_state_gives_same_output": test_hygiene.RANGES,
        "test_inputs_are_not_modified": test_hygiene.RANGES,
        "test_tokens_per_call_follow_the_chain_model": test_acceptance.CALLS,
        "test_logits_rows_follow_the_processed_target": test_sampling_params.RANGES,
        "test_greedy_rows_equal_greedy_decoding": test_sampling_params.GREEDY,
        "test_seeded_rows_ignore_the_rest_of_the_batch": test_sampling_params.SEEDED,
    }
    rows: dict[str, str] = {}  # the first row naming each property: the suite's table (the matrix comes later)
    for line in README.splitlines():
        if line.startswith("| `test_"):
            rows.setdefault(line.split("`")[1], line)
    for prop, case_ranges in ranges.items():
        assert case_ranges.describe() in rows[prop], f"README row of {prop} should say {case_ranges.describe()!r}"


def test_the_readmes_example_property_runs_through_the_plugin(tmp_path):
    from tests.runner_helpers import run_pytest

    section = README[README.index("### Writing a property") :]
    code = section[section.index("```python") + len("```python") : section.index("```\n", section.index("```python"))]
    (tmp_path / "test_example.py").write_text(code)
    run = run_pytest(["--spec-model", "reference", str(tmp_path / "test_example.py")], tmp_path)
    assert run.returncode == 0 and run.results[("reference", "test_emits_at_least_one_token")].outcome == "passed", (
        run.output[-3000:]
    )
