"""Repository-level pytest configuration.

Kept free of side effects: in an editable install the property suite lives under this
directory, so this file is also loaded when ``pytest --spec-model X`` runs from anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent


@pytest.fixture
def verifiers_dir() -> Path:
    """The known-correct and known-buggy verifiers the harness's own tests run against."""
    return REPO / "tests" / "verifiers"
