"""Anytime-valid sequential testing: a Dirichlet-multinomial mixture e-process.

Under the null (observations i.i.d. from the known bin probabilities m), the likelihood ratio
of a Dirichlet(a)-mixture alternative to the null,

    E_n = Gamma(A) / Gamma(A + n) * prod_b Gamma(a_b + n_b) / Gamma(a_b) / prod_b m_b^{n_b},

is a non-negative martingale with E_0 = 1, so by Ville's inequality
P(sup_n E_n >= 1/alpha) <= alpha: the harness may look after every batch and stop the moment
E crosses 1/alpha, without inflating the false-failure rate. Independent groups multiply (the
product is the likelihood ratio of the product mixture). E depends only on the counts, so it
can be updated batch by batch. The prior is centred on the null, a_b = m_b * bins.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln


class MixtureEProcess:
    def __init__(self, bin_mass: np.ndarray, group_of_bin: np.ndarray) -> None:
        """``bin_mass``: null probability of each bin within its group (sums to 1 per group)."""
        n_groups = int(group_of_bin.max()) + 1 if group_of_bin.size else 0
        bins_per_group = np.bincount(group_of_bin, minlength=n_groups).astype(np.float64)
        self.prior = bin_mass * bins_per_group[group_of_bin]
        self.prior_total = np.bincount(group_of_bin, weights=self.prior, minlength=n_groups)
        self.log_mass = np.log(np.where(bin_mass > 0, bin_mass, 1.0))
        self.group_of_bin = group_of_bin
        self.counts = np.zeros(bin_mass.shape, dtype=np.float64)
        self.log_e = 0.0

    def update(self, bin_counts: np.ndarray) -> float:
        """Add new observations (counts per bin) and return the updated log e-value."""
        self.counts += bin_counts
        group_n = np.bincount(self.group_of_bin, weights=self.counts, minlength=self.prior_total.size)
        has_bins = self.prior_total > 0  # groups expected never to be reached have no bins
        self.log_e = float(
            (gammaln(self.prior_total[has_bins]) - gammaln(self.prior_total[has_bins] + group_n[has_bins])).sum()
            + (gammaln(self.prior + self.counts) - gammaln(self.prior) - self.counts * self.log_mass).sum()
        )
        return self.log_e

    def crossed(self, alpha: float) -> bool:
        return self.log_e >= math.log(1 / alpha)
