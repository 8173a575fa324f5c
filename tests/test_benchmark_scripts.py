"""The recorder benchmarks still run against the recorder as it is now.

No timing is asserted here (figures live in benchmarks/RESULTS.md). Regression: the
"training thread only" variant's stand-in writer lacked an attribute the recorder began to read
(``throttled``), and bench_record died at its first step, unseen until the next benchmark run.
"""

from __future__ import annotations

import re

from .conftest import ROOT, run_py


def test_bench_record_runs_every_recorder_variant():
    proc = run_py(
        str(ROOT / "benchmarks" / "bench_record.py"),
        "--rounds", "1", "--steps", "3", "--no-throughput",
        "--variants", "bare_again,thread_only,recorder,no_self_check,committed",
        timeout=300,
        check=True,
    )  # fmt: skip
    ratios, handoff = proc.stdout.split("\n\n")[1:3]
    rows = [line for line in ratios.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| MLP", "| CNN", "| GPT (2 blocks)"]
    assert all(len(re.findall(r"\d\.\d{3}x", r)) == 5 for r in rows), proc.stdout
    # the training thread's own microseconds per step, beside a memcpy of the batch
    rows = [line for line in handoff.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 3 and all(len(re.findall(r"\d+(\.\d)? us", r)) == 3 for r in rows)


def test_bench_rankscan_finds_the_first_step_and_rank_with_every_variant(tmp_path):
    proc = run_py(
        str(ROOT / "benchmarks" / "bench_rankscan.py"),
        "--ranks", "12", "--rounds", "1", "--steps", "35", "--dir", str(tmp_path),
        timeout=600,
        check=True,
    )  # fmt: skip
    assert "first bad: step 27 on rank 7" in proc.stdout, proc.stdout
    assert "scan workers import torch: no" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| health")]
    assert len(rows) == 2 and all(len(re.findall(r"\d+\.\d\d s", r)) == 3 for r in rows)


def test_bench_batch_refs_records_by_reference_and_by_value():
    """Both variants run, and by reference the file holds far fewer bytes per step (a reference
    that silently fell back to by value would show the same bytes)."""
    proc = run_py(
        str(ROOT / "benchmarks" / "bench_batch_refs.py"), "--rounds", "1", "--steps", "2",
        timeout=300, check=True,
    )  # fmt: skip
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| MLP", "| CNN", "| GPT (2 blocks)"]
    for r in rows:
        by_value, by_ref = (float(x) for x in re.findall(r"([\d.]+) KiB", r)[1:3])
        assert by_ref < 16 < by_value, r


def test_profile_record_splits_a_recorded_step_into_the_recorders_parts():
    """The profile names parts by the recorder's own functions: a rename there would leave the
    part empty and its time under "other", unseen. Sampled here without py-spy."""
    proc = run_py(
        str(ROOT / "benchmarks" / "profile_record.py"), "sample", "3", timeout=300, check=True
    )
    rows = dict(re.findall(r"^\| ([^|]+?) \| (\d+) \|", proc.stdout, re.M))
    assert int(proc.stdout.split("less the probe): ")[1].split()[0]) > 100, proc.stdout
    for part in ("gradient probe (in the step)", "record into the step log", "health row"):
        assert int(rows.get(part, 0)) > 0, proc.stdout
