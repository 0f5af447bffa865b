"""Running a property: the run in progress (``run``: seeds, budgets, verdicts), the harness's
decoding loop (``loop``) and the per-position check every exactness property shares
(``positions``). The properties themselves are :mod:`spectest.properties`.
"""
