"""The vocabulary of the reviewer's report: generic elements that ``view.py`` fills in.

The renderers (``markdown.py``, ``html.py``) draw these and nothing else, so they
know about sections, tables, grids, lists, pool pictures and traces, never about
proofs or BMC: a new section or number is written once, in ``view.py``.  Each is
a :class:`Renderer`, which walks a view the same way for every format and asks
the format only how each element looks.

The two formats have always worded a few things differently (Markdown spells
out what colour and layout say on the page).  Where they do, the view states
both, with :class:`Wording` (inline) or :class:`Layout` (blocks), so each
difference is a visible decision in one place rather than drift between two
renderers.

Elements are frozen dataclasses of strings and tuples: a view is built once
per document and drawn twice, and neither renderer may change it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

# --------------------------------------------------------------------------
# Inline elements: text within a paragraph, cell or list item.


@dataclass(frozen=True)
class Code:
    """An identifier, call or key, kept verbatim: reviewers copy these into searches and tests."""

    text: str


@dataclass(frozen=True)
class Strong:
    """A run-in label, so a reader scanning a section sees where each part starts."""

    text: str


@dataclass(frozen=True)
class Status:
    """A state as a word, never only a colour: Markdown has none, and not every reader sees red.

    ``loud`` for a state that alone means the checks cannot be trusted (a seeded
    bug nothing refuted).
    """

    word: str
    loud: bool = False


@dataclass(frozen=True)
class Link:
    """A jump to an anchor on the page; only text where the format cannot promise the anchor."""

    anchor: str
    content: Inline


@dataclass(frozen=True)
class Names:
    """Several identifiers: one element, because what keeps them apart depends on how code is shown."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Swatch:
    """A legend entry coloured like the grid cells of ``status``: the page explains its colours."""

    status: str
    text: str


@dataclass(frozen=True)
class Tinted:
    """Text whose tone the page shows in colour; where there is none the words carry it alone."""

    text: str
    tone: Literal["good", "quiet"]


@dataclass(frozen=True)
class Wording:
    """Where the two formats say a thing differently: both sayings, chosen here."""

    markdown: Inline
    html: Inline


Inline: TypeAlias = ("str | Code | Strong | Status | Link | Names | Swatch | Tinted | Wording"
                     " | tuple[Inline, ...]")
"""A piece of text; a tuple is its parts in order."""


# --------------------------------------------------------------------------
# Block elements.


@dataclass(frozen=True)
class Para:
    """A paragraph; ``muted`` when it says nothing happened, so it does not compete with findings."""

    content: Inline
    muted: bool = False


@dataclass(frozen=True)
class Heading:
    """A heading inside a section; the anchor lets links point at the part rather than the section."""

    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Listing:
    """A list; numbered when order means something (rank, position), ``style`` for the stylesheet."""

    items: tuple[Inline, ...]
    numbered: bool = False
    style: str = ""


@dataclass(frozen=True)
class Row:
    """A table row; a ``group`` row heads the ``sub`` rows under it, so a target and its parts read as one."""

    cells: tuple[Inline, ...]
    kind: Literal["", "group", "sub"] = ""


@dataclass(frozen=True)
class Table:
    """Headers and rows; ``style`` names the table for the stylesheet (``num`` right-aligns counts)."""

    headers: tuple[Inline, ...]
    rows: tuple[Row, ...]
    style: str = ""


@dataclass(frozen=True)
class Result:
    """A checked grid cell: mark and time, and the failure it links to, so a red cell leads to its cause."""

    status: str
    mark: str
    seconds: str
    link: str | None = None


@dataclass(frozen=True)
class Blank:
    """A grid cell empty by design, unlike ``None``, a result the run should have produced and did not."""


BLANK = Blank()


Cell: TypeAlias = "Result | Blank | None"
"""A grid cell: a result, nothing to check, or ``None`` for a result the run did not produce."""


@dataclass(frozen=True)
class GridRow:
    """A grid row: results per column, or (``note``) one remark standing for all of them.

    An ``aside`` row is not one of the grid's subjects (a sanity check beside them).
    A ``note`` has a short form for formats that cannot span a row and a long one
    for those that can.
    """

    label: Inline
    cells: tuple[Cell, ...] = ()
    kind: Literal["", "note", "aside"] = ""
    short: str = ""
    long: str = ""


@dataclass(frozen=True)
class Grid:
    """A status matrix: a row per subject, the ``fixed`` columns, then a column per key.

    Keys are identifiers (step names) and grow with the model, so they are kept
    apart from the fixed columns, which are words.
    """

    corner: str
    fixed: tuple[str, ...]
    keys: tuple[str, ...]
    rows: tuple[GridRow, ...]


@dataclass(frozen=True)
class Bars:
    """Counts by name with each one's share of the largest, so skew in a workload shows at once."""

    headers: tuple[Inline, Inline]
    items: tuple[tuple[str, str, float], ...]
    """(name, count as shown, percent of the largest count)."""


@dataclass(frozen=True)
class Stats:
    """A few headline figures, as (label, value): the numbers compared from one run to the next."""

    items: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Panel:
    """A titled group of blocks, shown beside its siblings where there is room to compare them."""

    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Panels:
    """Panels side by side on the page, one after another in text."""

    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Fact:
    """A headline fact of the verdict; ``code`` when the value is an identifier to copy exactly."""

    label: str
    value: str
    code: bool = False


@dataclass(frozen=True)
class Verdict:
    """The verdict, its headline facts, the settings and where the run came from.

    One element, because it is what a pipeline owner reads first and each format
    draws it as one thing (a banner, a bold line with a short list).
    """

    ok: bool
    word: str
    facts: tuple[Fact, ...]
    settings_label: str
    settings: tuple[tuple[str, str], ...]
    byline: Inline


@dataclass(frozen=True)
class Alerts:
    """One item per failure up front, so nobody scrolls to learn what broke; ``see`` has the details."""

    lead: str
    see: tuple[str, str]
    """(anchor, title) of the section with the details."""
    items: tuple[Inline, ...]


@dataclass(frozen=True)
class Prose:
    """A Markdown document embedded as written (it is maintained as a file beside the code).

    Its headings move ``shift`` levels down to nest under the report's; ``empty``
    is said instead when there is no document.
    """

    markdown: str
    shift: int
    empty: str


@dataclass(frozen=True)
class BlockCell:
    """One block of a pool picture, every field already text, with the fields that differ.

    ``queue`` is the block's place in the eviction order in words; ``differs``
    names the fields (``ref``, ``free_pos``, ...) that differ from the other side.
    """

    id: str
    state: Literal["null", "free", "used"]
    ref: str
    queue: str
    key: str | None
    tokens: str | None
    extra_keys: tuple[str, ...]
    marks: tuple[str, ...]
    differs: frozenset[str]


@dataclass(frozen=True)
class Picture:
    """A pool after a step: its blocks, the index, the free queue and pending events.

    ``free`` and ``events`` are ``None`` when the picture did not record them;
    ``differs`` names whole parts (``free``, ``index``, ...) that differ.
    """

    blocks: tuple[BlockCell, ...]
    index: tuple[tuple[str, str], ...]
    free: tuple[str, ...] | None
    num_free: str
    events: tuple[str, ...] | None
    differs: frozenset[str]


@dataclass(frozen=True)
class StepView:
    """One step of a counterexample: the call, its outcome, what changed, the pool afterwards.

    ``actual`` is the implementation's pool on the step where it diverges from the
    model (``picture``); ``unchanged`` steps are not drawn again.
    """

    index: str
    call: str
    outcome: str
    changes: tuple[str, ...]
    picture: Picture | None
    actual: Picture | None
    differs: tuple[str, ...]
    unchanged: bool


@dataclass(frozen=True)
class Failure:
    """A failing case in full: where it failed, its message and details, and the trace.

    Failures are numbered in document order; ``anchor`` is what the summary and
    the proof matrix link to.
    """

    number: int
    anchor: str
    title: str
    kind: str
    phase: str
    case_id: str
    seconds: str
    message: str
    details: str | None
    steps: tuple[StepView, ...]
    no_trace: str
    """What stands in for the trace when there is none."""


@dataclass(frozen=True)
class Layout:
    """Where the two formats lay a thing out differently: both layouts, chosen here."""

    markdown: tuple[Block, ...]
    html: tuple[Block, ...]


Block: TypeAlias = ("Para | Heading | Listing | Table | Grid | Bars | Stats | Panels | Verdict | Alerts"
                    " | Prose | Failure | Layout")


@dataclass(frozen=True)
class Section:
    """A part of the report, always present so the report has the same shape for every run.

    ``nav`` is the short name for a table of contents; ``status`` and ``count``
    qualify the title where the format can show them without breaking anchors.
    """

    id: str
    title: str
    nav: str
    blocks: tuple[Block, ...]
    status: str | None = None
    count: int | None = None


@dataclass(frozen=True)
class Report:
    """The whole report: a title, then sections in reading order; the first is the lead, read first."""

    title: str
    sections: tuple[Section, ...]


# --------------------------------------------------------------------------
# The walk every format shares.


class Renderer:
    """A format: a method per element, named after its class in lower case (``para``, ``code``).

    The walk (text, parts, :class:`Wording`, :class:`Layout`) is the same for
    every format, so a renderer says only how each element looks, and ``side``
    picks its half of each :class:`Wording` and :class:`Layout`.
    """

    side: ClassVar[Literal["markdown", "html"]]

    def text(self, s: str) -> str:
        """Plain text, escaped for the format."""
        raise NotImplementedError

    def inline(self, x: Inline) -> str:
        """A piece of text: its parts in order, each element drawn by its method."""
        if isinstance(x, str):
            return self.text(x)
        if isinstance(x, tuple):
            return "".join(self.inline(part) for part in x)
        if isinstance(x, Wording):
            return self.inline(getattr(x, self.side))
        return self._draw(x)

    def blocks(self, blocks: Iterable[Block]) -> list[str]:
        """Each block drawn, a :class:`Layout` as this format's blocks."""
        return [drawn for block in blocks for drawn in (
            self.blocks(getattr(block, self.side)) if isinstance(block, Layout) else [self._draw(block)])]

    def _draw(self, element: object) -> str:
        draw: Callable[[Any], str] = getattr(self, type(element).__name__.lower())
        return draw(element)
