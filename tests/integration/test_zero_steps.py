"""A Recorder closed before its first step (an empty data loader, a loop that raised before it
began) records nothing, and says nothing alarming: it warned that its writer process had
failed ("recording ... stopped (the writer process failed: OSError: it exited)"), when the
close itself had ended that process."""

import textwrap

from tests.conftest import run_py

PROGRAM = textwrap.dedent(
    """
    import sys
    import warnings
    warnings.simplefilter("error")  # a RecorderWarning raises
    import torch
    import replay

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        opt.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    objects = {"model": model, "optimizer": opt}
    rec = replay.Recorder(sys.argv[1] + "/run.h5", objects=objects, step_fn=step)
    rec.close()
    with replay.Recorder(sys.argv[1] + "/run2.h5", objects=objects, step_fn=step):
        pass  # an empty data loader
    print("done")
    """
)


def test_a_recorder_closed_before_its_first_step_warns_nothing_and_writes_no_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    out = tmp_path / "runs"
    out.mkdir()
    p = run_py(str(script), str(out), cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and p.stdout == "done\n", p.stderr[-2000:]
    assert "replay" not in p.stderr, p.stderr
    assert list(out.iterdir()) == []
