"""A program that dies of an exception no step raised (a corrupt sample raising in the data
loader, an evaluation or logging line that overflows, Ctrl-C) left a recording that read
"closed cleanly" and a bisect that said "healthy", as if the run had ended well (pytorch/examples'
word_language_model at lr 1e36 died of an OverflowError in its logging line that way). The file
now keeps how the program ended (``/ended``): info and bisect name it, with where it was raised.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import h5py
import pytest

from replay.record.ending import ending
from replay.reports.verdict import Ended
from replay.store.layout import ENDED_BYTES
from replay.store.reader import Recording
from tests.conftest import replay_cli, replay_json, run_py

PROGRAM = textwrap.dedent(
    """
    import os
    import signal
    import sys
    import torch
    import replay

    style, how = sys.argv[1].split("-")  # (a `with` block, or a Recorder closed at exit)
    path = sys.argv[2]
    with open(path + ".runs", "a") as runs:  # (how many times the program ran)
        runs.write("ran\\n")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if how == "step" and loss.item() > 0:
            raise RuntimeError("inside the step")
        return loss

    def hook(tp, e, tb):  # the program's own hook: still called, after replay's
        print("own hook:", tp.__name__, file=sys.stderr)

    if how == "hooked":
        sys.excepthook = hook

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return 160

        def __getitem__(self, i):
            if i == 100:  # (in batch 12)
                raise OSError(f"image file is truncated (sample {i})")
            return torch.randn(4), i % 2

    def loader():
        if how == "worker":
            yield from torch.utils.data.DataLoader(Images(), batch_size=8, num_workers=2)
        for i in range(20):
            if i == 12:
                if how == "kill":  # (as the out-of-memory killer would)
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "interrupt":
                    raise KeyboardInterrupt
                if how.startswith("exit"):
                    sys.exit(int(how[4:]))
                raise ValueError("corrupt sample 7: image file truncated")
            yield torch.randn(8, 4), torch.randint(0, 2, (8,))

    if style == "with":
        with replay.Recorder(path, model=model, optimizer=opt, step_fn=step) as rec:
            for batch in loader():
                rec.step(batch)
    else:
        rec = replay.Recorder(path, model=model, optimizer=opt, step_fn=step)
        for batch in loader():
            rec.step(batch)
    """
)
RAISED_AT = 1 + next(i for i, line in enumerate(PROGRAM.splitlines()) if "raise ValueError" in line)


def _record(tmp_path, how: str, style: str = "plain"):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    run = tmp_path / f"{how}.h5"
    p = run_py(str(script), f"{style}-{how}", str(run), cwd=tmp_path, timeout=120)
    return p, str(run)


@pytest.mark.parametrize("style", ["plain", "with"])
def test_an_exception_outside_any_step_is_kept_and_bisect_names_it_instead_of_healthy(
    tmp_path, style
):
    p, run = _record(tmp_path, "loader", style)
    assert p.returncode == 1
    # the program's traceback is what it would have been without a Recorder
    assert p.stderr.rstrip().endswith("ValueError: corrupt sample 7: image file truncated")
    assert "train.py" in p.stderr and "replay/" not in p.stderr.replace("replay/tests", "")
    with Recording(run) as rec:
        ended = rec.ended()
        assert rec.closed_cleanly
    assert ended is not None and ended.kind == "exception" and ended.type == "ValueError"
    assert ended.last_step == 11 and ended.where.endswith(f"train.py:{RAISED_AT} in loader")
    assert ended.traceback.endswith("ValueError: corrupt sample 7: image file truncated\n")
    info = replay_cli("info", run, timeout=120)
    assert info.returncode == 0
    assert (
        "  ended by        ValueError: corrupt sample 7: image file truncated, outside any step, "
        "after step 11, at "
    ) in info.stdout
    if style == "plain":  # (one bisect proves the verdict's line)
        out = replay_cli("bisect", run, timeout=300)
        assert out.returncode == 1, out.stderr[-2000:]
        # a health with no symptom is answered from the file: the program did not run again
        assert Path(run + ".runs").read_text() == "ran\n" and out.stderr == "", out.stderr
        assert out.stdout.startswith("healthy: ")
        assert "\n  but the program died: ValueError: corrupt sample 7" in out.stdout
        code, report, _ = replay_json("info", run)
        assert report["ended"]["type"] == "ValueError"
        page = tmp_path / "page.html"
        assert replay_cli("report", run, "-o", str(page), timeout=120).returncode == 0
        assert '<p class="warn" id="ended">But the program died: ValueError: corrupt' in (
            page.read_text()
        )


def test_a_data_loader_workers_exception_is_named_by_its_own_message_and_getitem_line(tmp_path):
    """The main process raises a worker's exception again with the worker's traceback as its
    message: info showed that whole traceback, escaped onto one line, as the ending, and named
    the program's ``for batch in loader`` line instead of the dataset's."""
    p, run = _record(tmp_path, "worker")
    assert p.returncode == 1 and "image file is truncated (sample 100)" in p.stderr
    info = replay_cli("info", run, timeout=120)
    raised = 1 + PROGRAM.splitlines().index(
        '            raise OSError(f"image file is truncated (sample {i})")'
    )
    assert (
        "  ended by        OSError: image file is truncated (sample 100) (in DataLoader worker "
        f"process 0), outside any step, after step 11, at {tmp_path}/train.py:{raised} in "
        "__getitem__\n"
    ) in info.stdout, info.stdout


def test_a_run_killed_outside_any_step_is_said_to_have_never_closed_its_recording(tmp_path):
    """SIGKILL (the out-of-memory killer's) leaves no exception to keep: bisect said "healthy"
    alone. It says the recording was never closed, after which step, and the memory the
    process held over the steps."""
    p, run = _record(tmp_path, "kill")
    assert p.returncode == -9, p.stderr[-2000:]
    out = replay_cli("bisect", run, timeout=300)
    assert out.returncode == 1 and out.stdout.startswith("healthy: "), out.stderr[-2000:]
    assert len(out.stdout.splitlines()) == 2  # (no traceback to point to)
    said = out.stdout.splitlines()[1]
    assert said.startswith(
        "  but the program died: it never closed its recording, after step 11: no exception"
    ), said
    assert re.search(r"; resident memory \d+\.\d\d GiB at step 0, \d+\.\d\d at 11$", said), said
    code, report, _ = replay_json("bisect", run)
    assert report["ended"]["kind"] == "killed" and report["ended"]["last_step"] == 11
    # and the doctor says it too (was: nothing in the checklist)
    code, doctor, _ = replay_json("doctor", run)
    died = [f for f in doctor if f["rule"] == "died_outside_a_step"]
    assert died and died[0]["severity"] == "error" and died[0]["steps"] == [11], doctor
    assert died[0]["evidence"]["kind"] == "killed" and "resident memory" in died[0]["title"]


def test_an_exception_a_step_raised_is_the_steps_and_not_an_ending(tmp_path):
    p, run = _record(tmp_path, "step")
    assert p.returncode == 1 and "RuntimeError: inside the step" in p.stderr
    with Recording(run) as rec:
        assert rec.ended() is None
        assert rec.first_bad()["exception"] == 0


@pytest.mark.parametrize(
    "how, style, kind",
    [("interrupt", "plain", "interrupted"), ("exit3", "with", "exit"), ("exit0", "with", None)],
)
def test_ctrl_c_and_a_failing_exit_are_endings_and_a_clean_exit_is_none(tmp_path, how, style, kind):
    # (the interpreter hands no SystemExit to sys.excepthook: an exit is seen by a `with` block)
    p, run = _record(tmp_path, how, style)
    assert p.returncode != 0 or how == "exit0", p.stderr[-2000:]
    with Recording(run) as rec:
        ended = rec.ended()
    assert (ended.kind if ended is not None else None) == kind
    if kind == "interrupted":
        # (not "outside any step": a Ctrl-C lands inside a step as often, which is not recorded)
        assert ended.describe().startswith("interrupted (KeyboardInterrupt), after step ")


def test_the_programs_own_excepthook_still_runs_after_the_recording_keeps_the_exception(
    tmp_path,
):
    p, run = _record(tmp_path, "hooked")
    assert p.returncode == 1 and p.stderr.strip() == "own hook: ValueError", p.stderr
    with Recording(run) as rec:
        assert rec.ended().type == "ValueError"


def test_a_huge_message_and_traceback_are_cut_to_fit_the_files_ended_dataset():
    try:
        raise ValueError("x" * 100_000 + "\nsecond line")
    except ValueError as e:
        d = ending(e, 5)
    assert d is not None and len(json.dumps(d).encode()) < ENDED_BYTES
    assert d["message"].startswith("xxx") and d["message"].endswith("second line")
    assert Ended.from_json(d).describe().startswith("ValueError: xxx")


@pytest.mark.parametrize(
    "planted",
    [
        b'{"kind": "exception"}',
        b"\xff\xfe",
        b'{"kind": "x", "type": "a"}',
        b"[" * 5000,
        # a kill is what a reader infers from a file left unclosed (Recording.ending), never
        # what a file says: was read as the program having been killed
        b'{"kind": "killed", "type": "", "message": "planted", "traceback": ""}',
    ],
)
def test_a_planted_or_damaged_ended_reads_as_no_ending_never_as_a_failure(tmp_path, planted):
    p, run = _record(tmp_path, "exit0")
    assert p.returncode == 0, p.stderr[-2000:]
    with h5py.File(run, "r+") as f:
        f["ended"][: len(planted)] = memoryview(planted)
    with Recording(run) as rec:
        assert rec.ended() is None
    assert replay_cli("info", run, timeout=120).returncode == 0


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("Linux only")


def test_a_warning_at_interpreter_exit_names_the_recorders_line_not_sys_1(tmp_path):
    """The self-check's "had not finished" warning of a Recorder closed at exit was shown at
    ``sys:1``: no frame of the program's is left when atexit runs the close."""
    script = tmp_path / "exits.py"
    script.write_text(
        "import atexit\n"
        "from replay.errors import warn_at_user_line\n"
        "atexit.register(warn_at_user_line, 'replay: at exit', (__file__, 7))\n"
    )
    p = run_py(str(script), cwd=tmp_path, timeout=60, fresh=True)
    assert p.returncode == 0
    assert p.stderr.startswith(f"{script}:7: RecorderWarning: replay: at exit"), p.stderr
