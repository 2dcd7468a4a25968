"""The generators: which calls to make.

:mod:`.workload` plays a vLLM-like engine, :mod:`.long_lived` the same on one
busy pool, :mod:`.directed` makes the feature pairs the others missed
(:mod:`.features` names them), :mod:`.legal` ships legal call sequences
(``corpus/``) every caller contract must accept.
"""
