"""The guard every replay runs user code under (replay/engine/hands_off.py), in this process:
this test file is user code to it, replay's own modules are not."""

from __future__ import annotations

import logging
import os
import shutil
import socket

import h5py
import numpy as np
import pytest
import torch

from replay.engine.hands_off import TouchedError, hands_off
from replay.store.selfcheck import SelfCheck, selfcheck_path, write_selfcheck


@pytest.fixture
def mine(tmp_path):
    f = tmp_path / "metrics.csv"
    f.write_text("step,loss\n0,1.0\n")
    return f


def test_a_write_to_a_file_that_existed_goes_to_a_copy_the_program_reads_back(mine):
    with hands_off() as g:
        with open(mine, "w") as fh:
            fh.write("new\n")
        with open(mine) as fh:
            assert fh.read() == "new\n"  # the program sees what it wrote
        with open(mine, "a") as fh:
            fh.write("more\n")
        fd = os.open(mine, os.O_RDONLY)  # (a read below Python's open: the file itself)
        assert os.read(fd, 100) == b"step,loss\n0,1.0\n"  # the run's file, untouched
        os.close(fd)
        assert str(os.path.realpath(mine)) in g.copies
    assert mine.read_text() == "step,loss\n0,1.0\n"
    assert not os.path.exists(g.scratch)


def test_an_append_writes_after_the_old_bytes_of_the_copy(mine):
    with hands_off():
        with open(mine, "a") as fh:
            fh.write("1,0.5\n")
        with open(mine) as fh:
            assert fh.read() == "step,loss\n0,1.0\n1,0.5\n"
    assert mine.read_text() == "step,loss\n0,1.0\n"


def test_logging_torch_save_numpy_and_h5py_write_copies_too(tmp_path, mine):
    ckpt, arr, h5 = tmp_path / "init.pt", tmp_path / "a.npy", tmp_path / "x.h5"
    torch.save({"w": torch.ones(2)}, ckpt)
    np.save(arr, np.zeros(3))
    with h5py.File(h5, "w") as f:
        f["x"] = np.arange(3)
    log = tmp_path / "train.log"
    log.write_text("old line\n")
    before = {p: p.read_bytes() for p in (ckpt, arr, h5, log)}
    with hands_off():
        torch.save({"w": torch.zeros(5)}, ckpt)
        assert torch.load(ckpt)["w"].shape == (5,)
        np.save(arr, np.ones(7))
        with h5py.File(h5, "a") as f:
            f["y"] = np.arange(2)
        handler = logging.FileHandler(log)
        logger = logging.getLogger("test_hands_off")
        logger.addHandler(handler)
        logger.warning("from the re-run")
        handler.close()
        logger.removeHandler(handler)
    assert {p: p.read_bytes() for p in before} == before


def test_what_the_re_run_creates_is_removed_afterwards(tmp_path):
    with hands_off():
        os.makedirs(tmp_path / "runs" / "version_1")
        (tmp_path / "runs" / "version_1" / "events.txt").write_text("x")
        with open(tmp_path / "started-123.txt", "w") as fh:
            fh.write("x")
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("how", ["remove", "rename", "replace", "rmtree", "truncate"])
def test_removing_moving_or_truncating_a_path_that_existed_is_refused(tmp_path, mine, how):
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "a.txt").write_text("a")
    new = tmp_path / "new.txt"
    with hands_off() as g:
        new.write_text("tmp")  # made by the re-run: its own to move
        with pytest.raises(TouchedError) as e:
            {
                "remove": lambda: os.remove(mine),
                "rename": lambda: os.rename(mine, tmp_path / "moved.csv"),
                "replace": lambda: os.replace(new, mine),
                "rmtree": lambda: shutil.rmtree(tmp_path / "outputs"),
                "truncate": lambda: os.truncate(mine, 0),
            }[how]()
        assert "existed before replay ran it" in str(e.value) and "replay.replaying()" in str(
            e.value
        )
        assert g.refused
    assert mine.read_text() == "step,loss\n0,1.0\n" and (tmp_path / "outputs" / "a.txt").exists()


def test_a_connection_is_refused_and_named():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        with hands_off(), pytest.raises(TouchedError, match=f"connects to 127.0.0.1:{port}"):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        server.close()


def test_replays_own_writes_go_where_replay_puts_them(tmp_path):
    run = str(tmp_path / "run.h5")
    write_selfcheck(run, SelfCheck("running"))
    with hands_off() as g:
        write_selfcheck(run, SelfCheck("ok", "bitwise on cpu", (0, 3)))  # replay's own code
    with open(selfcheck_path(run)) as fh:
        assert '"ok"' in fh.read() and not g.copies


def test_torch_replacing_its_own_compile_cache_is_let_through(tmp_path, monkeypatch):
    """torch.compile in the re-run writes the kernels the run cached, replacing them
    atomically: not the user's files, and refusing it broke every compiled program's replay."""
    from torch._inductor.codecache import write_atomic

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor_me"))
    cached = tmp_path / "torchinductor_me" / "kernel.py"
    cached.parent.mkdir()
    cached.write_text("old kernel")
    with hands_off():
        write_atomic(str(cached), "same kernel, compiled again")
    assert cached.read_text() == "same kernel, compiled again"
    elsewhere = tmp_path / "mine.py"  # torch writing the user's own file is still guarded
    elsewhere.write_text("mine")
    with hands_off(), pytest.raises(TouchedError):
        write_atomic(str(elsewhere), "overwritten")
    assert elsewhere.read_text() == "mine"


def test_the_guard_is_off_outside_a_replay(mine):
    with hands_off():
        pass
    with open(mine, "w") as fh:
        fh.write("the training's own write\n")
    assert mine.read_text() == "the training's own write\n"
    assert open is __builtins__["open"] if isinstance(__builtins__, dict) else True


def test_the_files_the_program_read_are_named_when_they_changed_since_a_time(tmp_path):
    import sys
    import time

    ckpt, config = tmp_path / "checkpoint.pt", tmp_path / "config.json"
    config.write_text("{}")
    began = time.time()
    os.utime(config, (began - 60, began - 60))  # older than the run
    torch.save({"step": 3}, ckpt)
    with hands_off() as g:
        torch.load(ckpt)
        with open(config) as fh:
            fh.read()
        # a program living under the interpreter's prefix (a system Python's /usr, the program
        # in /usr/src/app) is no library: its files are kept too (was: every path under it
        # was taken for Python's own)
        under_prefix = os.path.join(sys.prefix, "src", "app", "checkpoint.pt")
        g.note_read(under_prefix)
        g.note_read(torch.__file__)  # the libraries' own and code are never named
        g.note_read(str(tmp_path / "model.py"))
        assert list(g.read) == [str(ckpt), str(config), under_prefix]
        assert [p for p, _ in g.read_since(began - 1)] == [str(ckpt)]
