"""Every usage error of every command is one line ``replay: error: ...`` and exit 2; with
``--json`` every error is also one JSON document on stdout (issue 32, item 7: click printed its
four-line ``Usage:/Try/Error`` block, and an error under ``--json`` left stdout empty)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import replay_cli, replay_here


@pytest.fixture(scope="module")
def nan_run(mlp_nan_run):
    return mlp_nan_run


CASES = {
    "export_out_is_a_file": ["export", "{run}", "--out", "{file}"],
    "whatif_from_step_too_large": ["whatif", "{run}", "--from-step", "9" * 20, "--clip", "1"],
    "whatif_to_step_negative": ["whatif", "{run}", "--to-step", "-1", "--clip", "1"],
    "preflight_steps_zero": ["preflight", "--steps", "0", "--", "true"],
    "preflight_timeout_negative": ["preflight", "--timeout", "-1", "--", "true"],
    "preflight_timeout_zero": ["preflight", "--timeout", "0", "--", "true"],
    "info_missing_argument": ["info"],
    "bisect_unknown_option": ["bisect", "{run}", "--no-such-option"],
    "verify_bad_device": ["verify", "{run}", "--device", "tpu:9"],
    "verify_entry_without_functions": ["verify", "{run}", "--entry", "train.py"],
}


def _args(case: str, run, tmp_path) -> list[str]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return [a.format(run=run, file=a_file) for a in CASES[case]]


def _where_json_goes(args: list[str]) -> list[str]:
    """``--json`` before ``--`` (after it, preflight's own command starts)."""
    if "--" in args:
        i = args.index("--")
        return [*args[:i], "--json", *args[i:]]
    return [*args, "--json"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_usage_error_printed_clicks_four_line_block(case, nan_run, tmp_path):
    args = _args(case, nan_run, tmp_path)
    # whatif imports the recorded program before it checks its window: a child, not this process
    replay = replay_cli if args[0] == "whatif" else replay_here
    p = replay(*args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("replay: error: ")]
    assert len(errors) == 1, p.stderr
    assert "Usage:" not in p.stderr and "Try '" not in p.stderr, p.stderr
    assert p.stdout == ""
    j = replay(*_where_json_goes(args))
    assert j.returncode == 2, j.stderr
    doc = json.loads(j.stdout)
    assert doc["exit_code"] == 2 and doc["error"] and "\n" not in doc["error"], doc


def test_json_error_left_stdout_empty(tmp_path):
    """Not only usage errors: an unusable recording under ``--json`` is a JSON document too."""
    p = replay_here("info", str(tmp_path / "missing.h5"), "--json")
    assert p.returncode == 3, p.stderr
    assert json.loads(p.stdout)["exit_code"] == 3
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("replay: error: ")
