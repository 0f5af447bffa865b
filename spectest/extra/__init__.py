"""Adapters for implementations spectest did not write (engines' samplers), each an optional dependency.

Every adapter is a registered ``--spec-model`` name. It resolves without its package; when the
package (or the GPU it needs) is missing, its ``spectest_unavailable`` says why and every
property skips with that reason, so the suite and CI run anywhere.
"""
