"""A griffe extension: fxquant's docstrings say ``Example:``; griffe's Google parser knows
``Examples:``. Renamed before parsing, the doctests render as code blocks (as an admonition
their ``>>>`` lines would be read as Markdown, and ``['a', 'b']`` as a link)."""

from __future__ import annotations

import re
from typing import Any

import griffe

EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
