"""What the state machine's rules draw: prompts, pool shapes, masks, and the tables they hold.

Hypothesis can shrink and print only what a rule draws as arguments, so each
choice a rule makes is a strategy here with a readable value (a
:class:`Prompt` names its document, length, tail and extra keys), biased
towards what makes lookups hit (two documents whose prefixes requests
share) and shrinking towards the simplest case (one small group, caching
on, no mask, no images).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from kvpool.impl.request import MultiModalFeature, PlaceholderRange

from ..generate.runs import RunConfig

LORA_IDS = {"lora1": 1, "lora2": 2}
"""The adapter id each LoRA name a prompt may carry stands for."""


@dataclass(frozen=True)
class Prompt:
    """What a request reads: a prefix of a document, a tail, and extra keys."""

    doc: int
    length: int
    tail: tuple[int, ...] = ()
    lora: str | None = None
    salt: str | None = None
    images: tuple[tuple[int, int], ...] = ()
    """Multimodal items in order, each as (gap after the previous one, length): gap 0 is adjacent."""
    session: str | None = None

    def features(self, num_tokens: int) -> list[MultiModalFeature]:
        """The items that fit in the prompt, as vLLM lists them (sorted by offset)."""
        out: list[MultiModalFeature] = []
        at = 0
        for k, (gap, length) in enumerate(self.images):
            at += gap
            if at + length > num_tokens:
                break
            out.append(MultiModalFeature(f"img{k}", PlaceholderRange(at, length)))
            at += length
        return out


@dataclass
class Table:
    """Blocks held without a request (scratch space, copies made by a hash move)."""

    ids: list[int]
    live: bool = True


@st.composite
def configs(draw: st.DrawFn) -> RunConfig:
    """Pool shapes; they shrink towards one small group with caching on."""
    hbs = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.integers(1, 2))
    sizes = {g: hbs * draw(st.integers(1, 4)) for g in range(groups)}
    caching = draw(st.integers(0, 4)) < 4  # mostly on: most of the pool is about caching
    return RunConfig(num_blocks=draw(st.integers(2, 24)), caching=caching,
                  hash_block_size=hbs, block_sizes=sizes, events=draw(st.booleans()),
                  extra_keys=True, metrics=draw(st.booleans()))


skips = st.integers(0, 3).map(lambda i: i == 3)
"""Whether an engine step leaves out its partial entry: now and then (the entry is the common case,
and the next step's entry replacing it needs two steps in a row that make one)."""

_NO_MASK = st.none()
_MASK = st.lists(st.booleans(), min_size=1, max_size=3).map(tuple)
masks = st.integers(0, 3).flatmap(lambda i: _NO_MASK if i < 3 else _MASK)
"""Mostly no mask: a masked-out block breaks the chain that later hits follow.

(The two branches are built once: a strategy built per draw is validated per draw.)"""

_NO_IMAGES: st.SearchStrategy[tuple[tuple[int, int], ...]] = st.just(())
_IMAGES = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=3).map(tuple)
images = st.integers(0, 2).flatmap(lambda i: _NO_IMAGES if i < 2 else _IMAGES)
"""Mostly none; else one to three items, often adjacent or shorter than a hash chunk."""

prompts = st.builds(
    Prompt,
    doc=st.integers(0, 1),
    length=st.integers(1, 32),
    tail=st.lists(st.integers(0, 49), max_size=2).map(tuple),
    lora=st.integers(0, 5).map(lambda i: (None, "lora1", "lora2")[max(0, i - 3)]),
    salt=st.integers(0, 3).map(lambda i: "s1" if i == 3 else None),
    images=images,
    session=st.integers(0, 3).map(lambda i: "sess" if i == 3 else None),
)
"""Prefixes of two documents, so requests share prefixes; extra keys now and then."""
