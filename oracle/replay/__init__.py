"""A front end for production traffic: request traces replayed through an engine loop (``kvpool replay``).

* :mod:`.requests`: the traces read (Mooncake's format, a plain one), and a seeded synthetic one;
* :mod:`.run`: what the engine loops share: settings, arrivals on a simulated clock, what a run says;
* :mod:`.kvpool_engine`: kvpool's own continuous-batching loop around any pool, in lockstep with the model;
* :mod:`.vllm_engine`: vLLM's own scheduler stack with no model, its pool shadowed or replaced;
* :mod:`.routers`: router profiles asked at each admission, against what the pool served;
* :mod:`.report`: the run as Markdown and HTML, with its plots.
"""
