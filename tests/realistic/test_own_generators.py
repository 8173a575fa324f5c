"""Random generators the program made itself (noise_generator.py).

Was: a step drawing its noise from a ``torch.Generator`` of its own replayed from a later
snapshot with other noise, and verify called it non-determinism ("look for non-deterministic
kernels"): the suspects scan knew numpy's and python's generators, not torch's. Nor could the
user fix it: ``objects=`` kept only objects with a ``state_dict``, which no generator has.
"""

from __future__ import annotations

import json

from tests.realistic.test_real_programs import record, replay


def test_generators_given_to_the_recorder_replay_bitwise_from_every_snapshot(tmp_path, elsewhere):
    run, p = record(tmp_path, "noise_generator.py", "run.h5", "--hold")
    assert p.returncode == 0, p.stderr[-2000:]
    v = replay("verify", str(run), "--all", "--json", cwd=elsewhere)
    d = json.loads(v.stdout)
    assert d["deterministic"] is True and d["window"] == [0, 39], (d, v.stderr[-2000:])


def test_a_generator_left_out_is_named_as_state_no_snapshot_holds_not_as_nondeterminism(
    tmp_path, elsewhere
):
    run, p = record(tmp_path, "noise_generator.py", "run.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    v = replay("verify", str(run), "--json", cwd=elsewhere)
    d = json.loads(v.stdout)
    assert d["deterministic"] is False and d["cause"]["kind"] == "outside_state", d
    named = " ".join(d["cause"]["suspects"])
    assert "noise_gen (random generator torch.Generator" in named, d["cause"]
    assert "mask_rng (random generator numpy Generator" in named, d["cause"]
    hint = d["cause"]["hint"]
    assert '"noise_gen": noise_gen' in hint and '"mask_rng": mask_rng' in hint, hint
