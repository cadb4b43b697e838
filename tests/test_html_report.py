"""The self-contained HTML report (memgate.html_report): its tables, and its chart (memgate.chart_data's
curves drawn by memgate.html_chart) on the real sample; the same picture as an image: tests/test_plot.py.

Numbers asserted here are derived from the raw CSV with the csv module, not copied from memgate.
The browser test renders the page in headless Chromium (Debian's ``chromium`` package) and skips,
saying so, where it is not installed.
"""

from __future__ import annotations

import csv
import itertools
import re
import shutil
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import PTA271, judged_pta271

from memgate.budgets import budget_from_mapping
from memgate.chart_data import device_curves
from memgate.discover import discover, load
from memgate.html_report import render_html
from memgate.judge import judge
from memgate.metric_cache import MetricCache
from memgate.metrics import TOP_HOLDERS, profile_metrics
from memgate.model import DeviceModel, Profile, ProfileInfo, Series
from memgate.report import outcome_entry, profile_entry
from memgate.table import Ints, Table

GIB = 1 << 30
# Anything that would make the page fetch or link outside itself.
EXTERNAL = re.compile(
    r"(?i)(?:\b[a-z][a-z0-9+.-]*://|//[a-z0-9-]+\.[a-z]|\burl\s*\(|@import|<link\b|<script\b|<img\b|<iframe\b"
    r"|<object\b|<embed\b|<[^>]*\ssrc\s*=|\bxlink:href)"
)
HREF = re.compile(r"""\bhref\s*=\s*["']?([^"'\s>]*)""", re.IGNORECASE)


def assert_offline(page: str) -> None:
    found = EXTERNAL.findall(page)
    assert found == [], f"external reference(s) in the page: {found[:5]}"
    assert all(h.startswith("#") for h in HREF.findall(page)), HREF.findall(page)


def raw_peaks(sample: Path) -> tuple[int, int]:
    """(max PTA+GE Total Allocated, max APP Total Reserved) in bytes from memory_record.csv (MB = 2**20 B)."""
    alloc: list[int] = []
    app: list[int] = []
    with (sample / "memory_record.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["Component"] == "PTA+GE" and row["Total Allocated(MB)"]:
                alloc.append(int(Decimal(row["Total Allocated(MB)"]) * (1 << 20)))
            if row["Component"] == "APP" and row["Total Reserved(MB)"]:
                app.append(int(Decimal(row["Total Reserved(MB)"]) * (1 << 20)))
    return max(alloc), max(app)


@pytest.fixture(scope="module")
def sample() -> tuple[Profile, dict[str, Any], list[dict[str, Any]]]:
    return judged_pta271()


@pytest.fixture(scope="module")
def page(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]) -> str:
    profile, entry, outcomes = sample
    return render_html([entry], outcomes, [profile])


def test_page_is_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert_offline(page)
    assert "<svg" in page and "<style>" in page


def test_peak_value_is_exact(page: str) -> None:
    peak_alloc, peak_app = raw_peaks(PTA271)
    assert peak_alloc == 10782243840 and peak_app == 12504285184
    # Exact bytes in the peak marker's tooltip and label, and in the metrics table; IEC text beside.
    assert f"peak_allocated_bytes = {peak_alloc} B (10.04 GiB)" in page
    assert f'<tspan class="exact">({peak_alloc} B)</tspan>' in page
    assert f">{peak_alloc} B</td>" in page and f">{peak_app} B</td>" in page
    assert "peak 10.04 GiB · step 13" in page


def test_budget_lines_and_summary(page: str) -> None:
    # 10 GiB is exceeded by the 10.04 GiB peak: a red, labelled line; 11 GiB reserved holds: grey.
    exceeded = re.search(r'<g class="budget exceeded"><title>budget train-step: peak_allocated limit (\d+) B.*?</g>', page)
    assert exceeded and int(exceeded.group(1)) == 10 * GIB
    assert 'stroke="#d62728" class="budgetline"' in exceeded.group(0)
    label = re.search(r'<g class="budgetnote"><title>budget train-step: peak_allocated limit.*?</g>', page)
    assert label and '<tspan x="924">train-step: peak_allocated</tspan>' in label.group(0)
    assert ">≤ 10.00 GiB — EXCEEDED</tspan>" in label.group(0) and 'fill="#d62728"' in label.group(0)
    ok = re.search(r'<g class="budget ok"><title>budget train-step: peak_reserved limit (\d+) B.*?</g>', page)
    assert ok and int(ok.group(1)) == 11 * GIB and "#d62728" not in ok.group(0)
    # 80 GiB would squash the curves: listed as off scale instead of drawn.
    assert ">↑ train-step: peak_app_reserved</tspan>" in page and ">≤ 80.00 GiB (off scale)</tspan>" in page
    assert page.count('class="budgetline"') == 2
    # Summary table: one row per outcome, FAIL for the exceeded one.
    rows = re.findall(r'<tr class="(pass|fail|error)">', page)
    assert sorted(rows) == ["fail", "pass", "pass", "pass"]
    assert "1 of 4 budget checks failed" in page


def test_step_band_and_curves(page: str) -> None:
    assert re.search(r'<g class="stepband"><title>step 13: ', page)
    assert '<text x="' in page and ">step 13</text>" in page
    for kind in ("allocated", "reserved", "app_reserved"):
        assert re.search(rf'<path class="curve {kind}" d="M[\d.]+ [\d.]+(H[\d.]+V[\d.]+)+"', page), kind
    # The reserved series is flat: drawn with 2 points (first and last), losslessly.
    assert "PTA+GE reserved: 9309 samples, 2 drawn" in page


def test_holders_and_reconciliation(page: str, sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]) -> None:
    holders = sample[1]["devices"][0]["metrics"]["top_at_peak"]
    assert len(holders) == TOP_HOLDERS  # the report keeps 50; the page shows the 10 largest
    table = page[page.index("<h4>Top holders at the peak</h4>"):]
    table = table[: table.index("</table>")]
    assert table.count("<tr><td") == 10
    assert "npu::npu_fusion_attention_grad" in table and ">174133248</td>" in table
    assert re.search(r"<th [^>]*>op</th><th [^>]*>stream</th><th [^>]*>owner</th>", table)
    assert "PTA+GE equals the sum of its parts on 100.00% of its rows" in page
    assert ">4514074624</td>" in page  # the reconciled pre-window baseline, exact


def test_hostile_text_is_escaped(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]) -> None:
    profile, entry, outcomes = sample
    hostile = "<script>alert('x')</script> & <b>op</b>"
    entry = {**entry, "devices": [dict(d) for d in entry["devices"]]}
    device = entry["devices"][0]
    device["metrics"] = dict(device["metrics"])
    device["metrics"]["top_at_peak"] = [
        {"size": 512, "op": hostile, "stream": '"2"', "owner": "https://evil.example/x.js\n  at <module>",
         "t_alloc": None, "component": "PTA"}
    ]
    device["metrics"]["op_max_block_bytes"] = {hostile: 512}
    bad_outcomes = [{**outcomes[0], "budget": "<img src=x onerror=alert(1)>"}]
    page = render_html([entry], bad_outcomes, [profile])
    assert "<script" not in page and "<b>op</b>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;op&lt;/b&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "https:&#47;/evil.example/x.js" in page
    assert_offline(page)


def test_without_profiles_every_table_stays(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, entry, outcomes = sample
    page = render_html([entry], outcomes)
    assert "<svg" not in page and "the normalized profile was not given" in page
    assert ">10782243840 B</td>" in page and "Top holders at the peak" in page
    assert_offline(page)


def big_profile(n: int = 1_000_000, steps: int = 100) -> Profile:
    """A sawtooth over ``steps`` steps, a slow leak and noise: every sample a different value."""
    rng = np.random.default_rng(7)
    t0 = 1_764_246_877_000_000_000
    t = t0 + np.arange(n, dtype=np.int64) * 1_000 + rng.integers(0, 999, n)
    t.sort()
    phase = np.arange(n) % (n // steps)
    allocated = (6 * GIB + phase * 4096 + np.arange(n) * 64 + rng.integers(0, 1 << 20, n)).astype(np.int64)
    allocated[n // 3] = 14 * GIB + 12345  # a lone spike: the exact peak
    reserved = np.maximum.accumulate(allocated + (1 << 28))
    frame = Table({"t_ns": Ints.of(t), "allocated": Ints.of(allocated), "reserved": Ints.of(reserved),
                   "active": Ints.of(allocated)})
    bounds = np.linspace(0, n - 1, steps + 1).astype(np.int64)
    step_frame = Table({"step": Ints.of(np.arange(steps) + 1), "t_start": Ints.of(t[bounds[:-1]]),
                        "t_end": Ints.of(t[bounds[1:]])})
    device = DeviceModel("npu:0", series={"PTA": Series("PTA", frame, "synthetic/memory_record.csv")})
    return Profile("synthetic/rank3", "torch_npu", "3", (device,), step_frame, "synthetic")


def test_big_series_stays_small_and_exact() -> None:
    profile = big_profile()
    entry = profile_entry(ProfileInfo.of(profile), profile_metrics(profile))
    outcome = {"profile": profile.path, "rank": "3", "budget": "b", "metric": "peak_allocated",
               "limit": 12 * GIB, "value": 14 * GIB + 12345, "passed": False, "device": "npu:0", "message": "m"}
    started = time.perf_counter()
    page = render_html([entry], [outcome], [profile], max_points=2000)
    elapsed = time.perf_counter() - started
    assert len(page.encode()) < 400_000, len(page.encode())  # 1M samples x 2 curves
    assert elapsed < 10, elapsed
    assert_offline(page)
    assert f"peak_allocated_bytes = {14 * GIB + 12345} B" in page
    for kind in ("allocated", "reserved"):
        d = re.search(rf'<path class="curve {kind}" d="([^"]+)"', page)
        assert d is not None and 1 <= d.group(1).count("H") <= 2000  # <= max_points + 1 points
    assert "1,000,000 samples" in page
    assert page.count('<g class="stepband">') == 100


# ---- headless Chromium --------------------------------------------------------------------------

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("headless browser check needs Chromium: apt-get install chromium (Debian) — not installed here")


def test_renders_in_headless_chromium(page: str, tmp_path: Path) -> None:
    browser = _chromium()
    html_file = tmp_path / "memgate-report.html"
    html_file.write_text(page, encoding="utf-8")
    base = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", html_file.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The browser parsed the inline SVG: the curve paths, the peak and the budget lines are in the DOM.
    assert re.search(r'<path class="curve allocated" d="M[\d.]+ [\d.]+H', dom.stdout)
    assert '<g class="peak">' in dom.stdout and dom.stdout.count('class="budgetline"') == 2
    shot = tmp_path / "memgate-report.png"
    run = subprocess.run([*base, f"--screenshot={shot}", "--window-size=1400,2000", html_file.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = pytest.importorskip("PIL.Image", reason="pixel check needs Pillow").open(shot).convert("RGB")
    pixels = np.asarray(image).reshape(-1, 3).astype(int)
    blue = np.abs(pixels - [0x1F, 0x6F, 0xB4]).sum(axis=1) < 40  # the allocated curve's colour
    red = np.abs(pixels - [0xD6, 0x27, 0x28]).sum(axis=1) < 40  # FAIL, exceeded budget, peak
    assert blue.sum() > 800 and red.sum() > 300, (blue.sum(), red.sum())


BOXES_SCRIPT = """<script>
window.addEventListener("load", () => {
  const boxes = [];
  for (const svg of document.querySelectorAll("svg.chart")) {
    const plot = svg.querySelector("rect.plot").getBoundingClientRect();
    for (const el of svg.querySelectorAll("text")) {
      const r = el.getBoundingClientRect();
      boxes.push({chart: boxes.length && 0, cls: el.getAttribute("class"), text: el.textContent,
                  x: r.left, y: r.top, w: r.width, h: r.height,
                  plot: [plot.left, plot.top, plot.width, plot.height]});
    }
  }
  const pre = document.createElement("pre");
  pre.id = "memgate-boxes";
  pre.textContent = JSON.stringify(boxes);
  document.body.appendChild(pre);
});
</script>"""


def _label_boxes(page: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The rendered boxes of every text label of the page's charts, measured by headless Chromium
    (a script added to a copy of the page; the report itself has none)."""
    browser = _chromium()
    html_file = tmp_path / "boxes.html"
    html_file.write_text(page.replace("</body>", BOXES_SCRIPT + "</body>"), encoding="utf-8")
    dom = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2000",
                          "--dump-dom", html_file.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="memgate-boxes">(.*?)</pre>', dom.stdout, re.DOTALL)
    assert found, dom.stdout[-2000:]
    import html as html_module
    import json

    return list(json.loads(html_module.unescape(found.group(1))))


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    (ax, ay, aw, ah), (bx, by, bw, bh) = a, b
    return ax < bx + bw - 0.5 and bx < ax + aw - 0.5 and ay < by + bh - 0.5 and by < ay + ah - 0.5


def test_labels_never_overlap_in_chromium(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]],
                                          tmp_path: Path) -> None:
    """Budget limits a few MiB apart, a budget far off the scale, a long budget name and 65 steps
    of which most are too narrow to label: every label keeps a box of its own, and no budget label
    lies on the plot (where the lines and curves are)."""
    profile, entry, _ = sample
    curves = device_curves(profile.devices[0], entry["devices"][0])
    t = min(int(c.t_ns[0]) for c in curves)
    span = max(int(c.t_ns[-1]) for c in curves) - t
    cuts = [t + span * i // 200 for i in range(61)] + [t + span * (30 + 14 * i) // 100 for i in range(1, 6)]
    steps = [{"step": 100000 + i, "t_start": a, "t_end": b} for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    crowded = {**entry, "steps": steps}
    peak = entry["devices"][0]["metrics"]["peak_allocated_bytes"]
    outcomes = []
    for i, (metric, limit) in enumerate([("peak_allocated", 10 * GIB + k * (8 << 20)) for k in range(5)]
                                        + [("peak_reserved", 10 * GIB + 4 * (8 << 20)), ("peak_reserved", 10 * GIB),
                                           ("peak_app_reserved", 90 * GIB)]):
        name = f"budget-{i}" if i != 2 else "a-budget-name-far-longer-than-the-label-column-is-wide"
        outcomes.append({"profile": entry["path"], "rank": "0", "device": "npu:0", "budget": name, "metric": metric,
                         "limit": limit, "value": peak, "passed": peak <= limit, "message": f"{metric} verdict"})
    page = render_html([crowded], outcomes, [profile])
    boxes = _label_boxes(page, tmp_path)
    assert sum(b["cls"] == "budgetlabel" for b in boxes) == 8  # every budget labelled
    assert sum(b["cls"] == "steplabel" for b in boxes) == 5  # the wide steps only
    assert {b["cls"] for b in boxes} >= {"ylabel", "xlabel", "xtitle", "steplabel", "budgetlabel", "peaklabel"}
    rects = [(b["x"], b["y"], b["w"], b["h"]) for b in boxes]
    clashes = [(boxes[i]["text"], boxes[j]["text"]) for i in range(len(rects)) for j in range(i + 1, len(rects))
               if _overlap(rects[i], rects[j])]
    assert clashes == []
    plot = tuple(boxes[0]["plot"])
    assert [b["text"] for b in boxes if b["cls"] == "budgetlabel" and _overlap((b["x"], b["y"], b["w"], b["h"]), plot)] == []
    peak_label = next(b for b in boxes if b["cls"] == "peaklabel")
    assert plot[0] <= peak_label["x"] and peak_label["x"] + peak_label["w"] <= plot[0] + plot[2]  # inside the plot


# ---- every metric in the metrics table ------------------------------------------------------------

SAMPLES = Path(__file__).parent / "data" / "samples"


def _metrics_rows(page: str) -> dict[str, list[str]]:
    """The metrics table of the (first) device: metric -> [value, exact, pool, note] cell texts."""
    start = page.index('<table class="metrics">')
    table = page[start:page.index("</table>", start)]
    rows = {}
    for row in re.findall(r"<tr>(<td.*?)</tr>", table):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        rows[cells[0]] = cells[1:]
    return rows


def _page_of(path: Path, outcomes: list[dict[str, Any]] | None = None) -> tuple[dict[str, Any], str]:
    [found] = discover(path)
    profile = load(found)
    entry = profile_entry(ProfileInfo.of(profile), profile_metrics(profile))
    return entry, render_html([entry], outcomes or [], [profile])


def test_metrics_table_names_the_pool_and_the_reserved_before_window_note(page: str) -> None:
    rows = _metrics_rows(page)
    from memgate.budgets import LIMITS

    dump = {"allocated_at_dump_bytes", "reserved_at_dump_bytes", "largest_free_block_bytes", "free_block_fragmentation"}
    assert list(rows) == [key for key, _ in LIMITS.values() if key not in dump] + ["op_max_block_bytes"]
    # PTA271 memory_record.csv: PTA allocated peaks at 10782243840 under a flat 10875830272 reserved
    frag = 1 - 10782243840 / 10875830272
    assert rows["fragmentation"] == [f"{frag:.4f} ({frag:.2%})", repr(frag), "PTA",
                                     ("PTA reserved is at its maximum from its first sample: the value reflects "
                                     "memory reserved before the window")]
    assert rows["external_fragmentation"] == ["0.0000 (0.00%)", "0.0", "", ""]  # 0 in every pool: none named
    assert rows["leak_undetermined_bytes"][0] == "-" and rows["leak_undetermined_bytes"][3].startswith(
        "not measurable: needs at least 2 counted steps")
    pools = page[page.index('<table class="pools">'):]
    assert re.search(r"<tr><td>PTA</td>.*?<td>yes</td></tr>", pools[:pools.index("</table>")])


def test_budget_rows_show_ratio_metrics_as_ratios(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]) -> None:
    profile, entry, _ = sample
    budget = budget_from_mapping({"name": "frag", "external_fragmentation": 0.05}, origin="test")
    outcomes = [outcome_entry(judge(MetricCache(profile), budget, "external_fragmentation"))]
    page = render_html([entry], outcomes, [profile])
    row = re.search(r'<tr class="pass">.*?</tr>', page)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))
    assert cells[3:7] == ["external_fragmentation", "0.0000 (0.00%)", "0.0500 (5.00%)", "+0.0500"]
    assert cells[8] == "external_fragmentation 0.000 within budget 0.050 — rank 0 npu:0"


def test_snapshot_pool_state_rows() -> None:
    entry, page = _page_of(SAMPLES / "torch" / "snapshot_modern_small_cs336.pickle")
    metrics = entry["devices"][0]["metrics"]
    rows = _metrics_rows(page)
    assert rows["largest_free_block_bytes"][:2] == ["512.00 MiB", "536870912 B"]
    assert rows["reserved_at_dump_bytes"][1] == f"{metrics['reserved_at_dump_bytes']} B"
    assert rows["allocated_at_dump_bytes"][1:] == [f"{metrics['allocated_at_dump_bytes']} B", "",
                                                   ("the allocator&#x27;s block sizes, as "
                                                    "torch.cuda.memory_allocated() counts them")]
    value = metrics["free_block_fragmentation"]
    assert rows["free_block_fragmentation"][:2] == [f"{value:.4f} ({value:.2%})", repr(value)]
    assert rows["fragmentation"][2] == "allocator" and rows["external_fragmentation"][2] == "allocator"
    assert_offline(page)


def test_window_relative_cpu_peak_shows_the_carried_over_bytes() -> None:
    entry, page = _page_of(SAMPLES / "torch" / "cpu_train_leak_profile_memory.json")
    device = entry["devices"][0]
    carried = device["carried_over_bytes"]
    assert device["window_relative"] is True and carried == 39724
    rows = _metrics_rows(page)
    assert rows["peak_allocated_bytes"][3].startswith("window-relative: the writer&#x27;s totals leave out memory "
                                                      "allocated before profiling started; 38.79 KiB")
    assert ("<p class=\"fact\">window-relative totals (memory allocated before profiling started is not in them): "
            "carried_over_bytes = 39724 B (38.79 KiB), left out of peak_allocated_bytes</p>") in page
    assert rows["leak_undetermined_bytes"][:2] == ["294.79 KiB", "301868 B"]
    assert "allocated_at_dump_bytes" not in rows  # no snapshot: no pool-state rows


def test_notes_are_escaped(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]) -> None:
    profile, entry, outcomes = sample
    entry = {**entry, "devices": [dict(d) for d in entry["devices"]]}
    entry["devices"][0]["notes"] = {"fragmentation": "<script>x</script> & https://evil.example"}
    entry["devices"][0]["pool_of"] = {"fragmentation": "<b>PTA</b>"}
    page = render_html([entry], outcomes, [profile])
    rows = _metrics_rows(page)
    assert rows["fragmentation"][2:] == ["&lt;b&gt;PTA&lt;/b&gt;", ("&lt;script&gt;x&lt;/script&gt; &amp; "
                                         "https:&#47;/evil.example")]
    assert "<script" not in page
    assert_offline(page)


def test_every_figure_is_explained(page: str) -> None:
    """Every column heading and every metric name carries its explanation on hover; the
    reconciliation's consistency is spelled out under its table."""
    headings = re.findall(r"<th(\s[^>]*)?>(.*?)</th>", page)
    assert headings and all('title="' in attrs for attrs, _ in headings), [h for a, h in headings if "title" not in a]
    for key in ("peak_allocated_bytes", "fragmentation", "external_fragmentation", "step_growth_bytes", "op_max_block_bytes"):
        assert re.search(rf'<tr><td title="[^"]+">{key}</td>', page), key
    consistency = re.search(r'<th title="([^"]*)">consistency</th>', page)
    assert consistency and "share of the checked allocations" in consistency.group(1)
    assert '<p class="note">consistency: the share of the checked allocations' in page
    assert re.search(r'<span class="key" title="[^"]+"><i style="background:#1f6fb4">', page)  # curves in the legend


def test_times_are_relative_to_the_profile_start_with_the_absolute_time_on_hover(
        sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]], page: str) -> None:
    profile, entry, _ = sample
    device = entry["devices"][0]
    t0 = min(int(c.t_ns[0]) for c in device_curves(profile.devices[0], device))
    peak_t = device["peak_t_ns"]
    after = (peak_t - t0) / 1e6
    seconds, ns = divmod(peak_t, 10**9)
    import datetime as dt

    stamp = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    absolute = f"{stamp}.{ns:09d} UTC ({peak_t} ns since the epoch)"
    assert (f'peak at <span class="time" title="{absolute}">+{after:.3f} ms</span> after the profile start'
            in page)
    assert f"peak at t = {peak_t} ns" not in page
    assert "time since the profile start, its first memory sample (ms)" in page
    assert re.search(r'<text [^>]*class="xlabel"><title>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{9} UTC', page)


def test_a_budget_for_other_devices_shows_as_not_selected(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]]
                                                          ) -> None:
    _, entry, outcomes = sample
    skipped = {**outcomes[0], "passed": None, "value": None, "budget": "gpu", "skipped": "not selected: budget 'gpu' …"}
    page = render_html([entry], [*outcomes, skipped], None)
    assert re.search(r'<tr class="skipped">.*?<td class="result">not selected</td><td class="msg">not selected: '
                     r"budget &#x27;gpu&#x27; …</td></tr>", page)
    assert "1 of 4 budget checks failed, 1 not selected" in page


def _row_cells(page: str, metric: str) -> list[str]:
    [row] = [r for r in re.findall(r'<tr class="\w+">.*?</tr>', page) if f"<td>{metric}</td>" in r]
    return re.findall(r"<td[^>]*>(.*?)</td>", row)


def test_issue13_budget_rows_imbalance_owner_caps_and_shares() -> None:
    """rank_imbalance rows are ratios naming the worst and best rank; owner_caps rows are sizes;
    a limit written as a share of the capacity says of what."""
    gib = 1 << 30
    entry = {"path": "/r/rank0", "rank": "0", "format": "x", "metadata": {"device_capacity_bytes": {"npu:0": 2 * gib}},
             "devices": []}
    outcomes = [
        {"profile": "/r", "rank": "0,1", "budget": "b", "metric": "rank_imbalance[peak_allocated]", "limit": 0.05,
         "value": 0.25, "passed": False, "device": "npu:0", "message": "m", "worst_rank": "1", "best_rank": "0",
         "worst_value": 4 * gib, "best_value": 3 * gib},
        {"profile": "/r/rank0", "rank": "0", "budget": "b", "metric": "owner_caps[layers.*]", "limit": 512 << 20,
         "value": 256 << 20, "passed": True, "device": "npu:0", "message": "m"},
        {"profile": "/r/rank0", "rank": "0", "budget": "b", "metric": "peak_allocated", "limit": int(0.75 * 2 * gib),
         "value": gib, "passed": True, "device": "npu:0", "message": "m", "limit_share": 0.75},
        {"profile": "/r/rank0", "rank": "0", "budget": "c", "metric": "peak_reserved", "limit": 0, "value": gib,
         "passed": None, "device": "npu:0", "message": "", "error": "needs the capacity", "limit_text": "80%"},
    ]
    page = render_html([entry], outcomes)
    assert _row_cells(page, "rank_imbalance[peak_allocated]")[4:7] == [
        "0.2500 (25.00%) — worst rank 1 4.00 GiB, best rank 0 3.00 GiB", "0.0500 (5.00%)", "-0.2000"]
    assert _row_cells(page, "owner_caps[layers.*]")[4:7] == ["256.00 MiB", "512.00 MiB", "256.00 MiB"]
    assert _row_cells(page, "peak_allocated")[4:7] == ["1.00 GiB", "1.50 GiB (75% of 2.00 GiB)", "512.00 MiB"]
    assert _row_cells(page, "peak_reserved")[4:7] == ["1.00 GiB", "80%", "-"]


def test_issue13_owners_and_ops_at_the_peak_and_capacity_headroom() -> None:
    gib = 1 << 30
    entry = {"path": "/r/rank0", "rank": "0", "format": "x",
             "metadata": {"device_capacity_bytes": {"npu:0": 4 * gib}},
             "devices": [{"device": "npu:0", "metrics": {
                 "peak_reserved_bytes": 3 * gib, "peak_allocated_bytes": 2 * gib,
                 "owner_bytes_at_peak": {"<script>x</script>": 1 << 20, "layers.0": 2 * gib},
                 "op_bytes_at_peak": {"aten::mm": 3 << 20}}},
                 {"device": "npu:1", "metrics": {"peak_allocated_bytes": gib}}]}
    page = render_html([entry], [])
    assert_offline(page)
    assert "<script>x" not in page
    owners = re.search(r"<h4>Owners at the peak \(top 2 of 2\)</h4><table class=\"owners-at-peak\">.*?</table>", page)
    assert owners is not None
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", owners.group(0)) if "<td" in r]
    assert rows == [["layers.0", "2.00 GiB", str(2 * gib)], ["&lt;script&gt;x&lt;/script&gt;", "1.00 MiB", str(1 << 20)]]
    ops = re.search(r"<h4>Operators at the peak \(top 1 of 1\)</h4><table class=\"ops-at-peak\">.*?</table>", page)
    assert ops is not None
    assert re.findall(r"<td[^>]*>(.*?)</td>", ops.group(0)) == ["aten::mm", "3.00 MiB", str(3 << 20)]
    notes = re.findall(r'<p class="capacity">(.*?)</p>', page)
    assert [re.sub(r"<[^>]+>", "", n) for n in notes] == [
        "device capacity 4.00 GiB; headroom above the peak reserved: 1.00 GiB (25.00% of the capacity)"]
