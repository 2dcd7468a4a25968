"""The core: one call on the model and on a pool, compared.

:mod:`.adapter` reaches a pool, :mod:`.abstraction` reads its keys, events and
refusals as the model's, :mod:`.observe` sees its whole state at the level it
allows, :mod:`.lockstep` runs one call on both sides and compares.
"""
