"""report.html: one self-contained page per suite folder. Its content is checked from the HTML (per-seed values,
paired intervals, n = 1, offline rows, flags, claims, provenance, nothing fetched from elsewhere); its behaviour in
a real browser, headless Chromium driven over the DevTools protocol (standard library only), on the committed quick
reference: the table sorts on a header click, a row opens on ▸, every image is present and decoded."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from clbench import html_report, leaderboard
from clbench.metrics import ACCURACY
from tests._records import sealed

ROOT = Path(__file__).parents[1]
QUICK = ROOT / "results" / "reference" / "quick"
CHROMIUM = next((p for name in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(name))), None)


def _record(strategy: str, seed: int, last: float, status: str = "finished", offline: bool = False) -> dict:
    return sealed(_unsealed(strategy, seed, last, status, offline))


def _unsealed(strategy: str, seed: int, last: float, status: str, offline: bool) -> dict:
    first = (last + 20) / 100           # A_0 = last + 20, A_1 = last: avg_inc_acc = last + 10; forgetting 40, bwt -40
    R = [[last / 100, last / 100]] if offline else [[first, 0.0], [first - 0.4, 2 * last / 100 - first + 0.4]]
    metrics = {"last_acc": last, "avg_inc_acc": None if offline else last + 10, "train_s": 2.0 + seed,
               "forgetting": None if offline else 40.0, "bwt": None if offline else -40.0, "params_M": 0.1,
               "peak_mem_MB": 3.0}
    return {"run_id": f"sc__{strategy}__s{seed}", "status": status, "seed": seed,
            "reason": None if status == "finished" else "NonFiniteLossError: loss is nan",
            "spec": {"suite": "tiny", "scenario": {"name": "sc", "args": {}},
                     "strategy": {"name": strategy, "preset": "cpu", "args": {"mem_size": 20}}},
            "strategy_config": {"preset": "cpu"}, "code_fingerprint": "f" * 16,
            "env": {"machine": "cpu: 2 cores (test)", "device": "cpu", "python": "3.11.7", "git_commit": "abc",
                    "packages": {"torch": "2.14.1"}, "cpu_model": "Test CPU", "cpu_capability": "AVX2"},
            "metric_specs": [ACCURACY.to_dict()], "accuracy_matrix": R, "matrices": {"accuracy": R},
            "test_sizes": [10, 10], "params_per_step": [{"total": 10, "trainable": 10}] * len(R),
            "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:05:00+00:00",
            "metrics": metrics if status == "finished" else {}}


# a: 3 seeds, b: 3 seeds (paired with a), c: one seed (n=1), joint: offline, d: 1 finished + 1 failed
RECORDS = ([_record("a", s, v) for s, v in enumerate([60.0, 64.0, 62.0])]
           + [_record("b", s, v) for s, v in enumerate([50.0, 55.0, 51.0])]
           + [_record("c", 0, 40.0), _record("joint", 0, 90.0, offline=True),
              _record("d", 0, 30.0), _record("d", 1, 0.0, status="failed")])


class Page(HTMLParser):
    """The page's tags (name, attrs) and its text, as a browser's parser reads them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _write(tmp_path: Path, records: list[dict]) -> Path:
    (tmp_path / "runs").mkdir(parents=True)
    for r in records:
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    return html_report.write_html(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, Page]:
    path = _write(tmp_path_factory.mktemp("tiny"), RECORDS)
    text = path.read_text()
    return text, Page(text)


def test_the_page_is_self_contained(tiny):
    """No script, style sheet, image or font from elsewhere: every src/href is a data: URI or an in-page anchor."""
    text, page = tiny
    links = [a.get(k) for _, a in page.tags for k in ("src", "href") if a.get(k)]
    assert links and all(link.startswith(("data:image/png;base64,", "#")) for link in links)
    assert not [tag for tag, a in page.tags if tag in ("link", "iframe") or tag == "script" and "src" in a]
    assert "http://" not in text and "https://" not in text


def test_rows_follow_the_leaderboard_with_n_and_mean_plus_minus_std(tiny):
    """Rows in leaderboard order; n per row (failed runs said); a one-seed row has its n marked and no ± part; the
    offline row is tagged as such; the means and stds are the leaderboard's."""
    text, _ = tiny
    table = leaderboard.build(RECORDS)
    strategies = re.findall(r'<tr class="main"><td data-v="\d+">\d+</td><td data-v="([^"]+)"', text)
    assert strategies == list(table["strategy"]) == ["joint", "a", "b", "c", "d"]
    a = table[table["strategy"] == "a"].iloc[0]
    assert f'<td data-v="{a["last_acc"]:.10g}">{a["last_acc"]:.2f} <span class="pm">± {a["last_acc_std"]:.2f}' \
           f'</span></td>' in text
    c = _main(text, "c")
    assert '<td data-v="40">40.00</td>' in c and '<td data-v="1" class="n1" title="one seed: no spread to show">1' \
        '</td>' in c and "±" not in c
    assert '<td data-v="1" class="n1" title="one seed: no spread to show">1 (1 failed)</td>' in _main(text, "d")
    assert 'class="n1"' not in _main(text, "a")
    assert '</button> joint <span class="tag" title="trained on all experiences at once' in text
    assert text.count('class="tag"') == 1


def _main(text: str, strategy: str) -> str:
    """The row of ``strategy`` (its main line)."""
    return re.search(rf'<tr class="main"><td data-v="\d+">\d+</td><td data-v="{strategy}">.*?</tr>', text).group(0)


def _detail(text: str, strategy: str) -> str:
    return text.split(f'<td data-v="{strategy}">')[1].split("</tbody>")[0]


def test_a_rows_detail_holds_every_seed_and_the_paired_interval_to_the_top_continual_row(tiny):
    """b's detail lists each seed's scores and costs, and b − a (a: the top continual row; the offline joint ranks
    above it but is no continual row): d = (-10, -9, -11) per seed on avg_inc_acc and last_acc, mean -10,
    half-width t(0.975, 2) sd(d) / sqrt(3) = 2.48, excluding 0; forgetting is the same in every seed: 0 ± 0, which
    shows no difference. The joint row pairs with a on last_acc only (its other summaries are undefined), over
    their one common seed: no interval. A failed seed shows its reason."""
    text, _ = tiny
    detail = _detail(text, "b")
    for seed, value in enumerate([50.0, 55.0, 51.0]):
        assert (f"<tr><td>{seed}</td><td>finished</td><td>{value + 10:.2f}</td><td>{value:.2f}</td><td>40.00</td>"
                f"<td>-40.00</td><td>0.100</td><td>{2 + seed:.1f}</td><td>3.0</td></tr>") in detail
    half = stats.t.ppf(0.975, 2) * np.std([-10, -9, -11], ddof=1) / np.sqrt(3)
    assert f"{half:.2f}" == "2.48"
    for column in ("avg_inc_acc", "last_acc"):
        assert (f"<li><code>{column}</code> this row − <code>a</code>: -10.00 ± 2.48 (95% interval excludes 0: "
                f"this row worse; seeds 0, 1, 2)</li>") in detail
    assert ("<li><code>forgetting</code> this row − <code>a</code>: 0.00 ± 0.00 (95% interval includes 0: no "
            "difference shown; seeds 0, 1, 2)</li>") in detail
    joint = _detail(text, "joint")
    assert re.findall(r"<li>.*?</li>", joint) == [
        "<li><code>last_acc</code> this row − <code>a</code>: 30.00 (one common seed, 0: no interval)</li>"]
    assert "This is the scenario's top continual row" in _detail(text, "a")
    assert "<td>1</td><td>failed: NonFiniteLossError: loss is nan</td>" in _detail(text, "d")


def test_images_are_the_curves_and_each_rows_score_matrix(tiny):
    """One PNG per figure of clbench.report.figures: the curve of the scenario and a heatmap per finished row (the
    heatmap inside that row's detail)."""
    text, page = tiny
    images = [a for tag, a in page.tags if tag == "img"]
    assert sorted(a["alt"] for a in images) == sorted(["sc__accuracy.png"] + [
        f"sc__{s}__accuracy__matrix.png" for s in ("a", "b", "c", "d", "joint")])
    assert 'alt="sc__c__accuracy__matrix.png"' in _detail(text, "c")


def test_machine_and_code_and_flags_where_the_table_has_them(tmp_path, monkeypatch):
    """The provenance of report.md (CPU model and torch's kernels included); a ``flags`` column of the leaderboard
    (training adequacy) is shown beside the row's numbers, and no flags column without one."""
    build = leaderboard.build

    def flagged(records, root=None):
        table = build(records)
        table["flags"] = ["", "did not learn"] + [""] * (len(table) - 2)
        return table

    plain = _write(tmp_path / "plain", RECORDS[:3]).read_text()
    assert "<b>CPU</b>: Test CPU (torch CPU kernels: AVX2)" in plain and ">flags</th>" not in plain
    monkeypatch.setattr(leaderboard, "build", flagged)
    text = _write(tmp_path / "flagged", RECORDS[:6]).read_text()
    assert ">flags</th>" in text and '<td data-v="did not learn" class="flag">did not learn</td>' in text


def test_claims_that_name_the_suite_come_from_the_nearest_reference(tmp_path):
    """The claims table rows whose 'suite rows' cell names the suite (a word, not a prefix of another name) from
    REFERENCE.md two levels up; none without such a row."""
    (tmp_path / "REFERENCE.md").write_text("\n".join([
        "# Reference", "", "## Claims of the seed papers", "", "text", "",
        "| paper | claim | verdict here | suite rows | statistic |", "|---|---|---|---|---|",
        "| P | `x` beats y | reproduced | tiny: a vs b | +1 |",
        "| Q | z | not reproduced | tiny_full: a | – |", "", "## Next", "| not | a | claim |"]))
    out = tmp_path / "reference" / "tiny"
    text = _write(out, RECORDS[:3]).read_text()
    assert "<td>P</td><td><code>x</code> beats y</td><td>reproduced</td><td>tiny: a vs b</td>" in text
    assert "<td>Q</td>" not in text
    assert html_report.claims(out, ["other"]) is None


def test_an_empty_runs_folder_gives_a_page_that_says_so(tmp_path):
    """No records: the page says so (no table, no image) instead of failing."""
    text = _write(tmp_path, []).read_text()
    assert "<title>clbench · no runs</title>" in text and "<p>No run records.</p>" in text
    assert "<img" not in text and '<table class="board"' not in text


# ----------------------------------------------------------------------------------------------------- browser
def _high(fd: int) -> int:
    """``fd`` moved to a number of at least 10."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Chromium:
    """Headless Chromium driven over ``--remote-debugging-pipe``: DevTools protocol messages are JSON, each ended by
    a NUL byte, written to the browser's fd 3 and read from its fd 4 (bash puts the pipes there: dash takes one-digit
    descriptors only)."""

    def __init__(self, url: str, profile: Path) -> None:
        to_browser, self.write_fd = os.pipe()
        self.read_fd, from_browser = os.pipe()
        # above fd 4, so that placing one end at 3 or 4 cannot overwrite the other before it is placed
        to_browser, from_browser = (_high(fd) for fd in (to_browser, from_browser))
        command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                   "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,1000", "about:blank"]
        self.process = subprocess.Popen(["bash", "-c", f'exec "$@" 3<&{to_browser} 4>&{from_browser}', "bash",
                                         *command], pass_fds=(to_browser, from_browser),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser), os.close(from_browser)
        self.buffer, self.next_id = b"", 0
        try:
            page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
            self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
            self.call("Page.navigate", self.session, url=url)
            deadline = time.monotonic() + 60
            while self.js("[location.href, document.readyState]") != [url, "complete"]:
                assert time.monotonic() < deadline, f"{url} did not load"
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params, **({"sessionId": session} if session
                                                                               else {})}
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    assert "error" not in reply, reply
                    return reply["result"]
            chunk = os.read(self.read_fd, 1 << 16)
            assert chunk, "chromium closed the pipe"
            self.buffer += chunk
        raise TimeoutError(method)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", self.session, expression=expression, awaitPromise=True,
                           returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the element, scrolled into view."""
        x, y = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                       f"e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); "
                       f"return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", self.session, type=kind, x=x, y=y, button="left", clickCount=1)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        os.close(self.read_fd), os.close(self.write_fd)


ORDER = "[...document.querySelectorAll('#board0 tr.main')].map(r => r.cells[1].getAttribute('data-v'))"


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
def test_the_quick_reference_page_sorts_opens_rows_and_shows_its_plots_in_chromium(tmp_path):
    """The done-when of issue 35 on the committed quick reference (its records copied): a click on the last_acc
    header orders the rows by last_acc, best first, a second click reverses them (ties keep their order: both sorts
    are stable); ▸ opens the row's detail; every image is decoded with a size."""
    shutil.copytree(QUICK / "runs", tmp_path / "quick" / "runs")
    page = html_report.write_html(tmp_path / "quick")
    table = leaderboard.build(leaderboard.load_records(tmp_path / "quick"))
    rows = list(zip(table["strategy"], table["last_acc"]))
    best_first = [s for s, _ in sorted(rows, key=lambda r: -r[1])]
    browser = Chromium(page.as_uri(), tmp_path / "profile")
    try:
        assert browser.js(ORDER) == list(table["strategy"])
        header = "#board0 th[title^='score on all test data']"
        browser.click(header)
        assert browser.js(ORDER) == best_first
        assert browser.js(f"document.querySelector({json.dumps(header)}).getAttribute('aria-sort')") == "descending"
        browser.click(header)
        assert browser.js(ORDER) == [s for s, _ in sorted(rows, key=lambda r: r[1])]
        browser.click("#board0 tbody button.open")
        opened = browser.js("(() => { const d = document.querySelector('#board0 tbody tr.detail'); "
                            "return [d.hidden, d.innerText]; })()")
        assert opened[0] is False and "Every seed" in opened[1] and "Paired difference" in opened[1]
        sizes = browser.js("Promise.all([...document.images].map(i => i.decode().then(() => "
                           "[i.naturalWidth, i.naturalHeight])))")
        assert len(sizes) == 1 + 1 + len(table) and all(w > 100 and h > 100 for w, h in sizes)
    finally:
        browser.close()


def test_report_html_writes_the_page_beside_report_md_and_says_where(tmp_path, capsys):
    """``report --out DIR --html``: report.md and report.html from the same records; without --html no page."""
    from clbench.cli import main

    (tmp_path / "runs").mkdir()
    for r in RECORDS[:3]:
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    assert main(["report", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").exists() and not (tmp_path / html_report.PAGE).exists()
    capsys.readouterr()
    assert main(["report", "--out", str(tmp_path), "--html"]) == 0
    assert f"report: {tmp_path / 'report.html'}" in capsys.readouterr().err.splitlines()
    assert '<td data-v="a">' in (tmp_path / "report.html").read_text()
