"""Speed: a clock other processes cannot steal from (``clock``), plain and speculative decoding
loops over costed models (``decoding``), and the rounds that hold a measured speedup to the
model (``bench``).
"""
