"""Every relative link in the README and the docs points at a file that exists: a doc moved or
renamed without its links updated fails here. Links to web addresses are not followed."""

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


def _documents() -> list[Path]:
    docs = sorted((REPO / "docs").rglob("*.md"))
    return [REPO / "README.md", REPO / "web" / "README.md", *docs]


def _relative_links(text: str) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", text))
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http:, https:, mailto: ...; an anchor in the same page
        out.append(target.split("#", 1)[0])
    return out


def test_the_link_pattern_finds_relative_links_only() -> None:
    text = '[a](docs/x.md) [b](https://e.test/) [c](#here) `[d](no.md)` [e](../y.md#part "t")'
    assert _relative_links(text) == ["docs/x.md", "../y.md"]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = [
        target
        for target in _relative_links(doc.read_text(encoding="utf-8"))
        if not (doc.parent / target).exists()
    ]
    assert not broken, f"{doc.relative_to(REPO)}: links to missing files: {broken}"
