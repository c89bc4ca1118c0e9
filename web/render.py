"""Jinja2 rendering: whole pages, or one named block of the same page template for htmx.

This is the "template fragments" pattern (jinja2-fragments) in a dozen lines: `Template.blocks`
maps block names to render functions, so an htmx request gets exactly the markup the full page
would have had in that place, and page and fragment can never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


class UnknownBlockError(KeyError):
    """The page template has no block of the requested name."""


def make_env() -> Environment:
    """The one Jinja environment of the web pages: autoescape on for every template, strict
    undefined (a typo in a template is an error in the tests, not an empty string in production)."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env


def render(env: Environment, template: str, context: Mapping[str, Any], block: str | None = None) -> str:
    """Render a page, or only `block` of it (with the same context)."""
    t = env.get_template(template)
    if block is None:
        return t.render(context)
    fn = t.blocks.get(block)
    if fn is None:
        raise UnknownBlockError(f"{template} has no block {block!r}")
    return "".join(fn(t.new_context(dict(context))))
