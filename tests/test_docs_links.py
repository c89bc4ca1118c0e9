"""Every relative link in the README and the docs points at a file that exists, and a link to a
section (`page.md#section`) at a heading that page has: a doc moved or renamed, or a heading
reworded, without its links updated fails here. Links to web addresses are not followed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: `[text](target)` and `[text](target "title")`; images too. Code spans and fenced blocks are
#: dropped first, so an example such as `[x](y)` inside backticks is not taken for a link.
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def _documents() -> list[Path]:
    docs = sorted((REPO / "docs").rglob("*.md"))
    return [REPO / "README.md", REPO / "web" / "README.md", *docs]


def _prose(text: str) -> str:
    return _CODE.sub("", _FENCE.sub("", text))


def _relative_links(text: str) -> list[str]:
    """The targets of the links that point into the repository (`path`, `path#anchor`, `#anchor`)."""
    return [t for t in _LINK.findall(_prose(text)) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def _anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one suffixed `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_link_pattern_finds_relative_links_only() -> None:
    text = '[a](docs/x.md) [b](https://e.test/) [c](#here) `[d](no.md)` [e](../y.md#part "t")'
    assert _relative_links(text) == ["docs/x.md", "#here", "../y.md#part"]


def test_anchors_are_githubs() -> None:
    text = "# Title\n## `flightdeck up`\n## Measured, shipped defaults\n## Title\n```\n# not a heading\n```\n"
    assert _anchors(text) == {"title", "flightdeck-up", "measured-shipped-defaults", "title-1"}


def _resolves(doc: Path, target: str) -> bool:
    """Whether `target`, linked from `doc`, names an existing file (and heading, for a page)."""
    path, _, anchor = target.partition("#")
    file = doc if not path else doc.parent / path
    if not file.exists():
        return False
    return not anchor or file.suffix != ".md" or anchor in _anchors(file.read_text(encoding="utf-8"))


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    links = _relative_links(doc.read_text(encoding="utf-8"))
    broken = [target for target in links if not _resolves(doc, target)]
    assert not broken, f"{doc.relative_to(REPO)}: links to missing files or sections: {broken}"
