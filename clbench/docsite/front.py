"""The site's home page and changelog: README.md and CHANGELOG.md of the repository, their links rewritten for
the site (``docs/x.md`` is ``x.md`` there), so that the front page is written once."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def site_links(markdown: str) -> str:
    """Links of a repository-root document as seen from the site's root."""
    return markdown.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")


def pages(root: Path = ROOT) -> dict[str, str]:
    return {"index.md": site_links((root / "README.md").read_text()),
            "changelog.md": site_links((root / "CHANGELOG.md").read_text())}
