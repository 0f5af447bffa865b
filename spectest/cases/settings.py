"""Hypothesis settings profiles for spectest, built on top of the user's loaded profile.

``register_profiles()`` registers ``spectest-quick``, ``spectest-ci`` and ``spectest-thorough``
with the currently loaded profile as parent, so anything the user configured (verbosity,
suppressed health checks, ...) carries over; spectest only sets what exact replay and large
statistical examples need: no deadline, no example database (runs replay from the seed), no
multi-bug reports. Users' own tests that use :mod:`spectest.strategies` can load them too.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILE_EXAMPLES = {"quick": 20, "ci": 100, "thorough": 1000}
BUDGET_PROFILE = {"quick": "spectest-quick", "default": "spectest-ci", "thorough": "spectest-thorough"}
SLOW_BY_DESIGN = (HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture)


def register_profiles(parent: settings | None = None) -> None:
    parent = parent if parent is not None else settings.default
    suppressed = tuple(dict.fromkeys((*parent.suppress_health_check, *SLOW_BY_DESIGN)))
    for name, examples in PROFILE_EXAMPLES.items():
        settings.register_profile(
            f"spectest-{name}",
            parent=parent,
            max_examples=examples,
            deadline=None,
            database=None,
            print_blob=False,
            report_multiple_bugs=False,
            suppress_health_check=suppressed,
        )


def profile_for_budget(budget: str) -> settings:
    """The registered profile behind a --spec-budget (registered on first use)."""
    name = BUDGET_PROFILE[budget]
    try:
        return settings.get_profile(name)
    except Exception:
        register_profiles()
        return settings.get_profile(name)
