"""kvpool.oracle: the model against any pool with the reference API, call by call.

:mod:`.adapter` reaches a pool, :mod:`.abstraction` reads its keys, events and
refusals as the model's, :mod:`.observe` sees it (black box, white box where
vLLM's internals are there), :mod:`.lockstep` runs one call on both sides and
compares what it touched; :mod:`.workload`, :mod:`.campaign` and :mod:`.machine`
generate the calls, :mod:`.conform` runs both phases; :mod:`.trace` reads and
writes traces, :mod:`.events_check` and :mod:`.routers` read KV-event streams.
The files are listed in ``docs/ARCHITECTURE.md``.
"""
