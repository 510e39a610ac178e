"""mkdocs hook: links in the repository's root files that the site includes keep working.

``docs/contributing.md`` and ``docs/changelog.md`` include ``CONTRIBUTING.md`` and ``CHANGELOG.md``
with pymdownx.snippets. Those files link to the docs as ``docs/<page>.md``, which is right where
GitHub shows them, at the repository root; on the site the same text sits in a page inside
``docs/``, where the link must be ``<page>.md``. A Markdown preprocessor that runs right after
snippets has included them drops the ``docs/`` prefix from relative link targets. No page under
``docs/`` links to ``docs/...`` in its own text (there is no ``docs/docs/``), so nothing else
changes, and mkdocs still checks every rewritten link with ``--strict``.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

DOCS_LINK = re.compile(r"\]\(docs/")
SNIPPETS_PRIORITY = 32  # pymdownx.snippets' preprocessor; a lower priority runs after it


class _DropDocsPrefix(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return [DOCS_LINK.sub("](", line) for line in lines]


class RootLinks(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # the name Python-Markdown calls
        md.preprocessors.register(_DropDocsPrefix(md), "shoal_root_links", SNIPPETS_PRIORITY - 1)


def on_config(config: Any, **kwargs: Any) -> Any:
    config.markdown_extensions.append(RootLinks())
    return config
