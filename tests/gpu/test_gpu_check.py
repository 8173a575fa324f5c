"""``make gpu-check``'s script on a machine without CUDA: its one-line refusal, and its checks run
on the CPU (``--device cpu``) so that the script a lent GPU will run has run before."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_py

SCRIPT = Path(__file__).with_name("gpu_check.py")
torch = pytest.importorskip("torch")


def _report(path: Path) -> dict[str, dict[str, object]]:
    d = json.loads(path.with_suffix(".json").read_text())
    return {c["name"]: c for c in d["checks"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_without_cuda_gpu_check_says_so_in_one_line(tmp_path: Path) -> None:
    p = run_py(str(SCRIPT), cwd=tmp_path)
    assert p.returncode == 3, p.stderr[-2000:]
    assert p.stderr.strip() == (
        "gpu-check: no CUDA device here (--device cpu runs the checks on the CPU)"
    )
    assert not (tmp_path / "gpu-check-report.md").exists()


def test_an_unknown_check_is_refused_in_one_line(tmp_path: Path) -> None:
    p = run_py(str(SCRIPT), "--only", "reentry,warp", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "no check named warp" in p.stderr


def test_the_checks_run_on_the_cpu_and_write_their_report(tmp_path: Path) -> None:
    """The default re-entry path with a CPU batch moved inside the step, and a NaN bisected to
    its op and reproduced: each passes, with its time, in both reports."""
    report = tmp_path / "r.md"
    p = run_py(
        str(SCRIPT), "--device", "cpu", "--only", "reentry,nan", "--report", str(report),
        cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    checks = _report(report)
    assert [c["result"] for c in checks.values()] == ["pass"] * 2, checks
    assert "bitwise on cpu" in str(checks["reentry"]["detail"])
    assert "op aten::log" in str(checks["nan"]["detail"]) and "step 7" in str(
        checks["nan"]["detail"]
    )
    assert all(float(c["seconds"]) > 0 for c in checks.values())  # type: ignore[arg-type]
    md = report.read_text()
    assert "| nan | pass |" in md and "- device: cpu" in md


def test_a_check_that_fails_does_not_stop_the_others(tmp_path: Path) -> None:
    """Every command given 0.5 s: each check times out, is reported failed with why, and the
    next still runs; the run exits 1."""
    report = tmp_path / "r.md"
    p = run_py(
        str(SCRIPT), "--device", "cpu", "--only", "reentry,conv", "--timeout", "0.5",
        "--report", str(report), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert p.returncode == 1, (p.stdout[-3000:], p.stderr[-3000:])
    checks = _report(report)
    assert list(checks) == ["reentry", "conv"]
    for c in checks.values():
        assert c["result"] == "fail" and "timed out after" in str(c["detail"]), c
    log = report.with_suffix(".log").read_text()  # what a lent GPU's one run must bring back
    assert "## reentry: `" in log and "## conv: `" in log and "timed out after" in log, log


def test_no_command_runs_past_the_budget(tmp_path: Path) -> None:
    """A lent GPU machine kills the whole run at its limit: a command started near the end of
    the budget gets only what is left of it (not --timeout's 180 s), and past it none starts;
    its output is kept for the log."""
    import time

    gpu_check = pytest.importorskip("tests.gpu.gpu_check")
    ctx = gpu_check.Context("cpu", tmp_path, 180.0, 0, deadline=time.monotonic() + 3)
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        ctx.run(tmp_path, "-c", "print('started', flush=True); import time; time.sleep(60)")
    assert e.value.timeout <= 3 and time.monotonic() - t0 < 15
    assert "started" in ctx.failures[0] and "timed out after" in ctx.failures[0]
    with pytest.raises(gpu_check.CheckFailed, match="budget was spent"):
        ctx.run(tmp_path, "-c", "pass")


@pytest.mark.slow
def test_the_kernel_checks_run_on_the_cpu(tmp_path: Path) -> None:
    """A convolution, attention, torch.compile (aot_eager on the CPU), bf16 autocast, a sparse
    batch: the programs a GPU runs with cuDNN, flash attention and inductor record and replay
    bitwise; the sync check's loop runs; a fused AdamW under a GradScaler records unscaled
    norms; a complex layer's overflow is named at its multiply."""
    report = tmp_path / "r.md"
    p = run_py(
        str(SCRIPT), "--device", "cpu", "--only", "conv,sdpa,compile,autocast,sparse,sync,fused,spectral", "--report",
        str(report), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert {c["result"] for c in _report(report).values()} == {"pass"}
