"""``replay report``: the page it writes, read as HTML (the browser tests open it)."""

from __future__ import annotations

import json
import re
import shutil
import sys

from replay.report.assets import SCRIPT
from replay.report.escape import script_hash
from replay.store import open_recording
from replay.store.forensics import ForensicsReader
from tests.conftest import ROOT, replay_here, run_py


def _page(tmp_path, *args: str) -> str:
    out = tmp_path / "report.html"
    r = replay_here("report", *args, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    return out.read_text(encoding="utf-8")


def test_the_page_holds_the_verdict_and_fetches_nothing(example, tmp_path):
    html = _page(tmp_path, example.traced, "--bisect", example.bisect_json)
    b = example.bisect
    assert f'first bad step: <b id="first-bad">{b["first_bad_step"]}</b>' in html
    assert "<code>aten::div</code> (backward)" in html and "[culprit]" in html
    assert "sqrt_at_zero.py:65</code>" in html  # the source line, and its code
    assert "distance = torch.sqrt(((a - b) ** 2).sum(dim=1))" in html
    assert '<span id="samples">7</span>' in html and b["samples"] == [7]
    assert "two replays and the recording agree bitwise" in html
    assert "replay bisect sqrt_at_zero.h5" in html
    assert "ran at" not in html  # sqrt's backward is autograd's own formula: no line of ours
    # one self-contained file: one inline script, allowed by its hash, no URL of any kind
    assert html.count("<script") == 1 and SCRIPT in html
    assert script_hash(SCRIPT).replace("'", "&#x27;") in html
    assert not re.search(r"(https?|ftp|wss?):|//[a-z]", html, re.IGNORECASE)
    assert "src=" not in html and "href=" not in html and "@import" not in html


def test_a_bisect_report_of_another_step_is_not_taken_for_this_one(example, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**example.bisect, "first_bad_step": 3}))
    html = _page(tmp_path, example.traced, "--bisect", str(other))
    assert "unknown: the --bisect report names step 3" in html
    assert "agree bitwise" not in html
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = replay_here("report", example.traced, "--bisect", str(bad), "-o", str(tmp_path / "x.html"))
    assert r.returncode == 3 and "not a `replay bisect --json` report" in r.stderr


def test_the_ops_around_the_culprit_carry_the_sidecars_numbers(example, tmp_path):
    html = _page(tmp_path, example.traced)
    with ForensicsReader.open(example.traced.replace(".h5", ".forensics.h5")) as f:
        culprit = f.verdict["op_index"]
        row = f.op_row(culprit)
    tr = re.search(rf'<tr class="culprit" id="op-{culprit}">(.*?)</tr>', html).group(1)
    assert "aten::div" in tr and "culprit" in tr
    assert f'data-v="{row["stats"]["max"]!r}"' in tr  # the number itself, to sort by
    # without --bisect: what bisect found, kept in the sidecar's verdict
    assert "two replays and the recording agree bitwise" in html
    assert "not kept beside the recording" not in html


def test_a_sidecar_that_replay_trace_wrote_leaves_reproducible_to_bisect(example, tmp_path):
    """The sidecar kept no reproducibility: the page said "not kept" even after a bisect.
    bisect now keeps its finding in the verdict; a step `replay trace` traced has none."""
    with ForensicsReader.open(example.traced.replace(".h5", ".forensics.h5")) as f:
        assert f.verdict["reproducible"] is True and example.bisect["reproducible"] is True
    run = tmp_path / "copy" / "sqrt_at_zero.h5"  # (the session's sidecar stays bisect's)
    run.parent.mkdir()
    shutil.copy(example.traced, run)
    step = str(example.bisect["first_bad_step"])
    t = run_py("-m", "replay", "trace", str(run), "--step", step, cwd=tmp_path, timeout=300)
    assert t.returncode == 0, t.stderr[-2000:]
    html = _page(tmp_path, str(run))
    assert "not kept beside the recording" in html


def test_without_a_sidecar_the_page_says_what_bisect_adds(example, tmp_path):
    html = _page(tmp_path, example.plain)
    assert 'id="no-forensics"' in html and "adds the op-level part" in html
    with open_recording(example.plain) as rec:
        step = rec.first_bad()["nonfinite"]
    assert f'first NaN/Inf or exception at <b id="first-bad">step {step}</b>' in html
    assert "No traced step" in html
    assert f'class="mark bad" data-step="{step}"' in html


def test_a_rank_set_gets_the_per_rank_table(rank_set, tmp_path):
    html = _page(tmp_path, rank_set)
    assert '<section id="ranks">' in html
    assert 'id="rank-culprit">' in html and "rank 1" in html
    assert html.count('<tr class="culprit"><td>1</td>') == 1


def test_refuses_to_write_over_a_recording_and_reports_a_bad_one(example, tmp_path):
    r = replay_here("report", example.plain, "-o", str(tmp_path / "x.h5"))
    assert r.returncode == 2 and "refusing to write the report over a recording" in r.stderr
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5")
    r = replay_here("report", str(bad), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_report_imports_no_torch(example, tmp_path):
    code = (
        "import sys; from replay.cli import main\n"
        "try: main(sys.argv[1:])\n"
        "except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'report imported torch'\n"
    )
    out = tmp_path / "r.html"
    r = run_py("-c", code, "report", example.traced, "-o", str(out), fresh=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.exists() and sys.executable


def test_a_custom_functions_culprit_shows_the_backward_line_that_ran_it(tmp_path):
    """examples/custom_function_nan.py: the exp of a hand-written backward overflows. The page
    says the forward line that applied the Function and, under it, the backward line that ran
    the op, as ``replay bisect`` does; an op of autograd's own formulas (sqrt_at_zero's) has
    no such row (test above)."""
    rec = tmp_path / "cf.h5"
    example = str(ROOT / "examples" / "custom_function_nan.py")
    assert run_py(example, str(rec), cwd=tmp_path, timeout=300).returncode == 0
    b = run_py("-m", "replay", "bisect", str(rec), "--json", cwd=tmp_path, timeout=300)
    d = json.loads(b.stdout)
    assert (d["op"], d["phase"]) == ("aten::exp", "backward"), b.stderr[-2000:]
    assert (d["executed_at"]["function"], d["executed_at"]["code"]) == (
        "backward",
        "e = torch.exp(x)",
    )
    html = _page(tmp_path, str(rec))
    ran = html[html.index("<th>ran at</th>") :]
    assert f"custom_function_nan.py:{d['executed_at']['line']}</code> in <code>backward" in ran
