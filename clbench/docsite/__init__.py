"""The documentation site's generated pages: the reference read from the code (the command line from its parser,
every strategy's Config from its field declarations, scenarios, callbacks, models, suites, metrics) and the results
read from the committed records (one page per reference suite, the claims page), and the home page and
changelog from README.md and CHANGELOG.md.

:func:`pages` returns ``{path under docs/: markdown}``; ``docs/gen_pages.py`` writes them into the site at build time
(mkdocs-gen-files), so a page can never go stale: ``make docs`` builds them from the code and records of the tree.
"""

from __future__ import annotations

from clbench.docsite import cli_page, components, front, results, strategies


def pages() -> dict[str, str]:
    """Every generated page, by its path in the site's ``docs/`` tree."""
    return {**front.pages(), "reference/cli.md": cli_page.page(), **strategies.pages(), **components.pages(),
            **results.pages()}
