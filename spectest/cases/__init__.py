"""Case generation: Hypothesis recipes (``sizes``, ``chain``, ``logits``, ``ranges``), the toy
target/draft models with exactly known probabilities (``toy_models``), tensors on the run's
device (``tensors``), and Hypothesis settings (``settings``). The public surface is
:mod:`spectest.strategies`.
"""
