"""The documentation site: the pages generated from the code and the records (clbench/docsite) say what the code
and records say, the front page stays a front page, and the site built with ``mkdocs build --strict`` opens in
headless Chromium with its navigation and generated pages."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clbench.analysis.reference_tables import BLOCK
from clbench.docsite import cli_page, front, results, strategies, text
from clbench.registry import STRATEGIES

ROOT = Path(__file__).parents[1]
CHROMIUM = next((p for name in ("chromium", "chromium-browser") if (p := shutil.which(name))), None)
# a date or a commit id, also inside a name (``h200_2026-11-26_7ca7342``: ``_`` is a word character, so no ``\b``)
HISTORY = re.compile(r"(?<!\d)20\d\d-\d\d-\d\d(?!\d)|(?<![0-9a-z])(?:[0-9a-f]{7}|[0-9a-f]{40})(?![0-9a-z-])"
                     r"|\bissues? #?\d+|this session",
                     re.IGNORECASE)
# every hand-written page: README.md and all of docs/ (the generated pages are written into the site, not docs/)
PRODUCT_PAGES = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")))]


def test_every_shipped_strategy_has_its_config_table_with_declared_ranges_and_presets():
    pages = strategies.pages()
    text = "\n".join(pages.values())
    shipped = [n for n in STRATEGIES.names() if STRATEGIES.module_of(n).startswith("clbench.")]
    assert shipped and all(f"## `{name}`" in text for name in shipped)
    baselines = pages["reference/strategies/baselines.md"]
    replay = baselines.split("## `replay`")[1].split("\n## ")[0]
    assert "| field | type | default | allowed | `cpu` | `full` |" in replay
    assert "| `mem_size` | `int` | `2000` | >= 0; at most the scenario's training samples in the whole stream |" \
        in replay
    assert "used only with `optimizer` = `sgd`" in replay


def test_the_cli_page_is_the_parsers_help():
    assert "--suite" in cli_page.help_text(["run"]) and "usage: clbench run" in cli_page.help_text(["run"])
    assert "## `clbench list`" in cli_page.page()


def test_a_results_page_is_made_from_the_suites_records():
    page = results.suite_page("der_params")
    assert page.startswith("# der_params\n") and "clbench --suite der_params --out results/der_params" in page
    assert "| suite | scenario | strategy |" in page
    assert "torch CPU kernels: not recorded" in page      # records made before the kernel set was recorded
    assert not HISTORY.search(page.split("## Leaderboard")[0]), "a results page's text names a date or commit"
    assert all(p.stem.count("__") == 1 for p in results.suite_plots("quick"))


def test_a_suite_description_shows_its_placeholders_and_code_as_written():
    import markdown

    html = markdown.markdown(results.suite_page("dp_seqrec_games_paper").split("Make the same records")[0])
    assert "&lt;label&gt; --epochs 20" in html and "&lt;out&gt;/artifacts/&lt;run_id&gt;" in html
    assert "<label>" not in html and "<out>" not in html
    assert text.prose("a <b> & `c <d> & e` f > g") == "a &lt;b&gt; &amp; `c <d> & e` f &gt; g"
    code = markdown.markdown(text.prose("see `clbench show <out>/runs/<run_id>.json` & more"))
    assert "<code>clbench show &lt;out&gt;/runs/&lt;run_id&gt;.json</code> &amp; more" in code


def test_front_page_links_are_rewritten_for_the_site():
    assert front.site_links("[a](docs/how-to/x.md) [b](CHANGELOG.md)") == "[a](how-to/x.md) [b](changelog.md)"


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    first_screen = text[:text.index("## Set up")]
    assert len(text.splitlines()) <= 200
    for family in ("Avalanche", "regularization", "DyTox", "DER", "PETL", "LoRA", "MAM", "TAFT", "unlearning",
                   "DP-SGD", "ghost clipping", "Phantom Clipping", "Re-Attention", "recommendation", "dual form"):
        assert family in first_screen, family
    assert "make bench" in text and "make test" in text and "/work/" not in text and "CPU_SCALE" not in text


@pytest.mark.parametrize("page", PRODUCT_PAGES)
def test_product_pages_hold_no_history(page):
    found = HISTORY.findall((ROOT / page).read_text())
    assert not found, f"{page} names dates, commits or work items ({found[:3]}): history goes to CHANGELOG.md"


def test_reference_prose_holds_no_history():
    """results/REFERENCE.md's hand-written lines outside the generated tables and the quick and claims sections say
    what each suite is and how its budget was chosen, not when or in which round of work."""
    text = BLOCK.sub("", (ROOT / "results" / "REFERENCE.md").read_text())
    prose = [s for s in text.split("\n## ") if not s.startswith(("quick\n", "Claims of the seed papers\n"))]
    found = HISTORY.findall("\n".join(prose))
    assert not found, f"results/REFERENCE.md names dates, commits or work items ({found[:3]}): history goes to " \
                      "CHANGELOG.md"


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
def test_the_built_site_opens_in_chromium(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)], cwd=ROOT,
                   check=True, env={"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true",
                                    "PATH": "/usr/bin:/bin"})

    def dom(page: str) -> str:
        return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                               (site / page).as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout

    home = dom("index.html")
    for entry in ("Tutorial", "Add a strategy", "Command line", "Reference results", "Claims of the seed papers"):
        assert f">{entry}<" in re.sub(r"\s*<", "<", re.sub(r">\s*", ">", home)), entry
    replay = dom("reference/strategies/baselines.html")
    assert 'id="replay"' in replay and "<table>" in replay and "mem_size" in replay
    quick = dom("results/quick.html")
    assert "<img" in quick and "plots/quick/" in quick
