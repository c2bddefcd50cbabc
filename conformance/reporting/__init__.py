"""Rendering a report dict for people: summary.md, a self-contained index.html, matplotlib plots."""
from .html import render_html
from .markdown import render_markdown

__all__ = ["render_html", "render_markdown"]
