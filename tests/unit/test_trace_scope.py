"""The module scope (replay/trace/scope.py) on its own: what torch's ModuleTracker does not give
the trace (the innermost module, by its state_dict path; the run's own modules only)."""

from __future__ import annotations

import torch
from torch import nn

from replay.trace.dispatch import Off
from replay.trace.scope import ModuleScope


def test_the_innermost_of_the_runs_own_modules_is_named_by_its_state_dict_path():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 1)))
    netg, loss = nn.Linear(1, 1), nn.MSELoss()
    scope = ModuleScope(Off(), [("", net), ("netG", netg)])
    seen: list[str | None] = []

    def innermost(m: nn.Module, args: object, out: object = None) -> None:
        i = scope.innermost()
        seen.append(scope.modules.items[i] if i >= 0 else None)

    scope.__enter__()
    for m in (net[1][1], netg):
        m.register_forward_pre_hook(innermost)  # after the scope's own: it has entered
    loss.register_forward_hook(innermost)  # a module of the step, not of the run
    try:
        out = netg(net(torch.ones(1, 2)))
        loss(out, torch.zeros(1, 1))
    finally:
        scope.__exit__()
    assert seen == ["1.1", "netG", None]
    assert scope.stack == [] and scope.modules.index["1"] in scope.acts
    net(torch.ones(1, 2))  # the scope's hooks are gone: nothing is entered any more
    assert seen == ["1.1", "netG", None, None]
