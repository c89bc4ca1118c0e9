"""The runbook (`web/runbook.md`, also at docs/runbook.md) as the page `GET /runbook` serves.

Every alert's `runbook_url` is `<Flightdeck URL>/runbook#<alert name in lower case>` by default, so
a link in a page or a chat message opens the section of that alert on the same server the incident
link names. The runbook is plain Markdown of a few shapes (headings, paragraphs, lists, fenced
code, inline code, bold, links); `to_html` renders those, every piece of text escaped, each heading
with the anchor GitHub gives it, so the same `#anchor` works on a forge's rendering too.
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path

#: The runbook's source, shipped with the package.
RUNBOOK = Path(__file__).resolve().parent / "runbook.md"

_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,4})\s+(.*)$")
_ITEM = re.compile(r"^(\s*)([-*]|\d+\.)\s+(.*)$")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _inline(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        code, bold, label, url = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{_inline(bold)}</strong>")
        elif url.startswith(("http://", "https://", "#")):
            out.append(f'<a href="{html.escape(url)}">{_inline(label)}</a>')
        else:  # a path in the repository: shown, not linked (the server does not serve it)
            out.append(f"{_inline(label)} (<code>{html.escape(url)}</code>)")
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def to_html(markdown: str) -> str:
    """The runbook's Markdown as an HTML fragment (escaped; headings carry their anchors)."""
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []
    ordered = False
    code: list[str] | None = None

    def flush() -> None:
        nonlocal ordered
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + f"</{tag}>")
            items.clear()

    for line in markdown.splitlines():
        if code is not None:
            if line.strip().startswith("```"):
                out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
                code = None
            else:
                code.append(line)
            continue
        if line.strip().startswith("```"):
            flush()
            code = []
            continue
        heading = _HEADING.match(line)
        item = _ITEM.match(line)
        if heading is not None:
            flush()
            level, text = len(heading.group(1)), heading.group(2)
            out.append(f'<h{level} id="{html.escape(anchor(text))}">{_inline(text)}</h{level}>')
        elif not line.strip():
            flush()
        elif item is not None and not item.group(1):
            if para:
                flush()
            ordered = ordered if items else item.group(2)[0].isdigit()
            items.append(item.group(3))
        elif items:
            items[-1] += " " + line.strip()  # a list item's continuation line
        else:
            para.append(line.strip())
    if code is not None:
        out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
    flush()
    return "\n".join(out)


@cache
def page_html() -> str:
    """The shipped runbook rendered (once per process: the file ships with the package)."""
    return to_html(RUNBOOK.read_text(encoding="utf-8"))
