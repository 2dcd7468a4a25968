"""KV-event streams, read as a router that rebuilds the prefix index reads them.

:mod:`.check` names the events that break the stream's rules, :mod:`.warnings`
what breaks none but leaves a router guessing, :mod:`.routers` replays a
stream through Dynamo's and llm-d's indexing rules.
"""
