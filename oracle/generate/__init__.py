"""The generators: which calls to make.

:mod:`.workload` plays a vLLM-like engine (its run's shape in :mod:`.runs`, its
requests from :mod:`.requests`, its legal cache entries from :mod:`.entries`, a
second pool from :mod:`.two_pools`, its wrong calls from :mod:`.misuse`),
:mod:`.long_lived` the same on one busy pool, :mod:`.directed` makes the feature
pairs the others missed (:mod:`.features` names them), :mod:`.legal` ships legal
call sequences (``corpus/``) every caller contract must accept.
"""
