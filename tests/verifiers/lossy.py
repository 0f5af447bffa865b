"""A lossy verifier for the meta-tests that declares less loss than it has.

Typical acceptance with its argmax fallback moves 0.2 to 0.5 of each position's mass (TV) on
the suite's drafts; this one declares at most 0.05 per token, so lossy mode must fail it by
``rules.WITHIN_MAX_TV``, while the registered ``typical-acceptance`` (declared lossy, no
limit) passes every property it runs.
"""

from __future__ import annotations

from spectest.implementations.lossy import TypicalAcceptance


class OverclaimingTypical(TypicalAcceptance):
    spectest_max_tv = 0.05


overclaiming_typical = OverclaimingTypical()
