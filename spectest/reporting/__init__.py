"""Reporting: the results file and its schema (``results``), the terminal summary (``summary``),
HTML and Markdown reports (``report``) and their plots (``plots``).
"""
