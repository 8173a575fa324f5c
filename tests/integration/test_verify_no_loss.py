"""A step that returns nothing (the loss logged elsewhere, or none at all): verify has no loss
to show for it, and says so with null, not with the NaN that marks the empty column."""

import textwrap

from tests.conftest import replay_json, run_py

PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    import replay

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        opt.zero_grad()
        model(batch).pow(2).mean().backward()
        opt.step()  # returns nothing

    with replay.Recorder(sys.argv[1], objects={"model": model, "optimizer": opt},
                         step_fn=step, snapshot_every=4) as rec:
        for _ in range(6):
            rec.step(torch.randn(8, 4))
    """
)


def test_verify_of_steps_that_return_nothing_says_null_for_their_loss_not_nan(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    p = run_py(str(script), str(tmp_path / "run.h5"), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"))
    assert rc == 0 and v["deterministic"] is True, err[-2000:]
    assert len(v["steps"]) == 6
    for s in v["steps"]:
        assert s["match"] and s["loss"] is None and s["recorded_loss"] is None, s
        assert isinstance(s["param_fingerprint"], float), s
