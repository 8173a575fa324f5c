"""What no state_dict holds of the run's parameters, and a loop changes between steps: which
parameters each optimizer group holds and which are frozen (capture/objects.py: param_layout,
apply_layout). Gradual unfreezing adds a group and unfreezes a backbone; a replay goes back
and forth across that point."""

from __future__ import annotations

import torch

from replay.capture.objects import RunObjects, apply_layout, param_layout, run_params


def _run() -> tuple[torch.nn.Sequential, torch.optim.Optimizer, RunObjects]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1, momentum=0.9)
    return model, opt, RunObjects({"model": model, "optimizer": opt})


def _build() -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    model, opt, _ = _run()
    return model, opt


def test_a_group_added_and_a_backbone_unfrozen_are_put_back_and_taken_away():
    model, opt, objs = _run()
    before = param_layout(objs, model)
    assert before == {
        "params": ["model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"],
        "groups": {"optimizer": [["model.1.weight", "model.1.bias"]]},
        "frozen": ["model.0.weight", "model.0.bias"],
    }
    model[0].requires_grad_(True)
    opt.add_param_group({"params": model[0].parameters(), "lr": 5.0})
    after = param_layout(objs, model)
    sd = opt.state_dict()

    # a replay of the program as it starts (one group, backbone frozen) loads the later state
    fresh, fresh_opt, fresh_objs = _run()
    apply_layout(fresh_objs, fresh, after)
    fresh_opt.load_state_dict(sd)  # raised before: a different number of parameter groups
    assert [len(g["params"]) for g in fresh_opt.param_groups] == [2, 2]
    assert fresh_opt.param_groups[1]["params"][0] is fresh[0].weight
    assert fresh_opt.param_groups[1]["lr"] == 5.0
    assert all(p.requires_grad for p in fresh.parameters())

    # and back: an earlier snapshot's layout takes the group away and freezes the backbone
    apply_layout(fresh_objs, fresh, before)
    assert [len(g["params"]) for g in fresh_opt.param_groups] == [2]
    assert [p.requires_grad for p in run_params(fresh_objs, fresh)] == [False, False, True, True]


def test_a_layout_of_other_parameters_changes_nothing():
    """Names that are not the replay's (another model, a wrapper's prefix): no group is made
    and nothing is unfrozen; load_state_dict says what does not fit."""
    model, opt, objs = _run()
    names = ["model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"]
    for layout in (
        {"params": names, "groups": {"optimizer": [["model.7.weight"]]}, "frozen": names[:2]},
        {"params": [f"model._orig_mod.{n[6:]}" for n in names], "groups": {}, "frozen": []},
        "not a layout",  # (an untrusted file's)
    ):
        apply_layout(objs, model, layout)
        assert [len(g["params"]) for g in opt.param_groups] == [2]
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]


_NORMS: dict[int, float] = {}  # each step's norm over the optimizer's gradients, by hand


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor):
    loss = model(batch).square().mean()
    optimizer.zero_grad()
    loss.backward()
    grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
    _NORMS[len(_NORMS)] = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    optimizer.step()
    return loss


def test_the_recorded_gradient_norm_covers_a_param_group_the_loop_added(tmp_path):
    """Was: the Recorder measured the gradients of the parameters the optimizer held when it
    started; the backbone a loop unfroze and gave the optimizer later was left out of every
    step's grad_norm. The step records the flags where they changed, too."""
    import replay
    from replay.store.reader import open_recording

    model, opt = _build()
    _NORMS.clear()

    with replay.Recorder(
        tmp_path / "run.h5", model=model, optimizer=opt, step_fn=_step, build_fn=_build,
        self_check=False, handle_signals=False,
    ) as rec:  # fmt: skip
        for t in range(4):
            if t == 2:
                model[0].requires_grad_(True)
                opt.add_param_group({"params": model[0].parameters()})
            rec.step(torch.randn(3, 4))
    with open_recording(tmp_path / "run.h5") as r:
        recorded = dict(zip(r.health()["step"].tolist(), r.health()["grad_norm"].tolist()))
        flags = {t: r.read_step(t).get("trainable") for t in range(4)}
    for t in range(4):
        assert abs(recorded[t] - _NORMS[t]) <= 1e-5 * _NORMS[t], (t, recorded, _NORMS)
    assert flags[0].tolist() == [False, False, True, True] and flags[1] is None
    assert flags[2].tolist() == [True] * 4 and flags[3] is None
