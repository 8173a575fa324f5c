"""Every script in examples/ runs and reaches the verdict its docstring promises.

The promise is two structured docstring lines:
  ``Verdict: kind=nonfinite phase=forward op=aten::log samples=5`` -> ``replay bisect --json``
  agrees on each key (``none``: bisect finds nothing, exit 1; ``demo``: the script is the demo);
  ``Doctor: rule_a, rule_b`` -> ``replay doctor --json`` reports those rules (``silent``: no
  finding of severity warning or error).
Every recording must also ``replay verify`` bitwise over its whole replayable window.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import replay_here, run_py

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def promise(path: Path) -> tuple[dict[str, str] | str, list[str]]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    verdict, doctor = None, []
    for line in doc.splitlines():
        if line.startswith("Verdict:"):
            body = line.split(":", 1)[1].split()
            verdict = (
                body[0]
                if body == ["none"] or body == ["demo"]
                else dict(kv.split("=", 1) for kv in body)
            )
        elif line.startswith("Doctor:"):
            doctor = [r.strip() for r in line.split(":", 1)[1].split(",") if r.strip()]
    assert verdict is not None, f"{path.name}: no 'Verdict:' line in its docstring"
    return verdict, doctor


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_py(*args, cwd=cwd, timeout=300)


def test_every_example_promises_a_verdict():
    assert len(EXAMPLES) >= 16
    for p in EXAMPLES:
        promise(p)


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_reaches_its_verdict(script, tmp_path):
    verdict, doctor = promise(script)
    if verdict == "demo":
        r = run(str(script), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "replay tui runs/" in r.stdout
        # README's sample is what the demo prints (the checkout's own path aside)
        printed = r.stdout.replace(str(ROOT) + os.sep, "").splitlines()
        start = printed.index("$ replay bisect runs/gpt_diverging_lr.h5")
        end = printed.index("", start)
        readme = (ROOT / "README.md").read_text()
        assert "```\n" + "\n".join(printed[start:end]) + "\n```" in readme, printed[start:end]
        return
    rec = str(tmp_path / f"{script.stem}.h5")
    r = run(str(script), rec, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    b = run("-m", "replay", "bisect", rec, "--json", cwd=tmp_path)
    if verdict == "none":
        assert b.returncode == 1, (b.stdout[-1000:], b.stderr[-1000:])
    else:
        assert b.returncode == 0, b.stderr[-2000:]
        got = json.loads(b.stdout)
        for key, want in verdict.items():
            value = got.get(key)
            if key == "samples":
                assert [int(s) for s in want.split(",")] == value, (key, value)
            else:
                assert str(value) == want, (key, value, got)
    # Every example replays bitwise, the failing step included (a healthy run that bisect
    # never replays proves nothing: verify replays its whole window).
    v = run("-m", "replay", "verify", rec, "--json", cwd=tmp_path)
    assert v.returncode == 0, (v.stdout[-2000:], v.stderr[-2000:])
    verified = json.loads(v.stdout)
    assert verified["deterministic"] is True and verified["replayed_steps"] > 0, verified["cause"]
    if doctor:
        d = replay_here("doctor", rec, "--json")  # (torch-free: in this process)
        assert d.returncode == 0, d.stderr[-2000:]
        found = json.loads(d.stdout)
        rules = {f["rule"] for f in found}
        for name in doctor:
            if name == "silent":
                loud = [f["rule"] for f in found if f["severity"] in ("error", "warning")]
                assert loud == [], loud
            else:
                assert name in rules, (name, sorted(rules))
