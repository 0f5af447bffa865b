"""Statistics: plan a distribution check from a tolerance, sample with anytime-valid
early stopping, conclude with pooled chi-square tests (``checks``, ``chisquare``, ``sequential``).
"""
