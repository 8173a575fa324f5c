"""Snapshots through the writer thread reuse one state's worth of buffers (issue 43 item 3).

A snapshot the step log does not take (a GPU's state; a CPU state larger than half the log; here
the log turned off) was copied into fresh memory every time: page-locked on a GPU, never given
back; 1.9-5.8 s of page faults for a 1 GiB model's snapshot on the CPU (RESULTS.md). Now the
copies go into the transport's arena and come back to it once the writer has sent them: the
next snapshot is a copy into the same memory, and the file holds each snapshot's own values.
"""

from __future__ import annotations

import torch

import replay
from replay.capture.tensors import leaf_to_tensor
from replay.store import open_recording
from tests.integration.test_no_readback_on_training_thread import batch_for, build, clipped_step


def test_snapshots_off_the_step_log_reuse_the_arena_and_keep_their_own_values(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("REPLAY_STEP_LOG", "off")  # the writer thread's way (a GPU's snapshots)
    allocated = -1
    monkeypatch.setenv("REPLAY_SELF_CHECK", "0")
    model, opt = build()
    path = tmp_path / "run.h5"
    before: dict[int, dict[str, torch.Tensor]] = {}
    with replay.Recorder(
        path, model=model, optimizer=opt, step_fn=clipped_step, build_fn=build, snapshot_every=4
    ) as rec:
        for t in range(13):
            if t % 4 == 0:
                before[t] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            rec.step(batch_for(t))
            rec.flush()  # (each snapshot sent before the next: its buffers are back)
            if t == 4:  # (the optimizer's state exists from step 0's update on)
                allocated = rec.transport.arena.misses
        arena = rec.transport.arena
        assert arena.misses == allocated and arena.hits > allocated  # steps 8, 12: none
    with open_recording(path) as f:
        assert sorted(before) == [int(s) for s in f.snapshot_steps()]
        for t, state in before.items():
            saved = f.read_snapshot(t)["model"]
            for k, v in state.items():
                assert torch.equal(leaf_to_tensor(saved[k]), v), (t, k)
