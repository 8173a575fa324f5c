"""The recorder's gradient norm measured on a thread beside the optimizer's step (capture/probe.py,
capture/aside.py): the same bits as on the training thread, and only where nothing can change a
gradient meanwhile."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import replay.capture.probe as probe_mod
from replay.capture.probe import _READS_GRADS, GradProbe

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="measuring beside the step needs a second core"
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # (a core left free: the condition to measure beside the step)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def jobs(monkeypatch):
    """The jobs started beside the step (the real ``run_aside``, counted)."""
    started = []

    def counted(fn):
        started.append(fn)
        return run(fn)

    run = probe_mod.run_aside
    monkeypatch.setattr(probe_mod, "run_aside", counted)
    return started


def model_and_grads(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 3))
    m(torch.randn(32, 64)).pow(2).sum().backward()
    return m


def measured(optimizer_fn, aside: bool) -> tuple[torch.Tensor, torch.nn.Module]:
    m = model_and_grads()
    opt = optimizer_fn(m.parameters())
    probe = GradProbe(list(m.parameters()), opt, aside=aside)
    probe.begin()
    opt.step()
    gn, _, stepped = probe.end()
    probe.close()
    assert stepped
    return gn, m


OPTIONS = {
    torch.optim.SGD: [
        dict(lr=0.1, momentum=m, nesterov=n, weight_decay=w, maximize=x, dampening=0.0)
        for m, n, w, x in itertools.product((0.0, 0.9), (False, True), (0.0, 0.01), (False, True))
        if not (n and m == 0.0)
    ],
    torch.optim.Adam: [
        dict(lr=1e-3, weight_decay=w, amsgrad=a, maximize=x)
        for w, a, x in itertools.product((0.0, 0.01), (False, True), (False, True))
    ],
    torch.optim.AdamW: [
        dict(lr=1e-3, weight_decay=w, amsgrad=a, maximize=x)
        for w, a, x in itertools.product((0.0, 0.01), (False, True), (False, True))
    ],
}


@pytest.mark.parametrize("cls", _READS_GRADS, ids=lambda c: c.__name__)
def test_the_optimizers_measured_beside_their_step_never_write_a_gradient(cls):
    """What the thread beside the step rests on: a listed optimizer's step, in every option
    a CPU run can give it without foreach, fused or differentiable, writes no gradient (its
    version counter and its bits stay). A torch release that changes that fails here."""
    assert set(OPTIONS) == set(_READS_GRADS)
    for options in OPTIONS[cls]:
        m = model_and_grads()
        opt = cls(m.parameters(), **options)
        for _ in range(2):  # (the first step makes the state: momentum buffers, moments)
            before = [(p.grad._version, p.grad.clone()) for p in m.parameters()]
            opt.step()
            for (version, bits), p in zip(before, m.parameters()):
                assert p.grad._version == version, (cls.__name__, options)
                assert torch.equal(p.grad, bits), (cls.__name__, options)


@pytest.mark.parametrize("cls", _READS_GRADS, ids=lambda c: c.__name__)
def test_a_norm_measured_beside_the_step_is_the_norm_measured_on_the_training_thread(cls, jobs):
    def make(params):
        return cls(params, lr=1e-3)

    beside, m1 = measured(make, aside=True)
    assert len(jobs) == 1  # it did run beside the step
    alone, m2 = measured(make, aside=False)
    assert len(jobs) == 1
    assert beside.dtype == torch.float64 and torch.equal(beside, alone)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)  # and the step it ran beside is bitwise the same step


def test_a_nonfinite_norm_beside_the_step_brings_its_absmax(jobs):
    m = model_and_grads()
    m[0].weight.grad[3, 5] = float("inf")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    probe = GradProbe(list(m.parameters()), opt, aside=True)
    probe.begin()
    opt.step()
    gn, gmax, _ = probe.end()
    probe.close()
    assert len(jobs) == 1 and gn.item() == float("inf") and gmax.item() == float("inf")


@pytest.mark.parametrize(
    "why",
    ["foreach", "fused", "another pre-hook", "another post-hook", "a global hook"],
)
def test_whatever_may_write_a_gradient_during_the_step_keeps_the_norm_on_the_training_thread(
    why, jobs
):
    """foreach SGD with Nesterov momentum adds into the gradients in place; a user's step hook
    may write them too: then the norm is taken before the step, on the training thread."""
    handles = []

    def make(params):
        opt = torch.optim.SGD(
            params, lr=0.1, momentum=0.9, nesterov=True, foreach=why == "foreach",
            fused=why == "fused" or None,
        )  # fmt: skip
        if why == "another pre-hook":
            handles.append(opt.register_step_pre_hook(lambda *a: None))
        if why == "another post-hook":
            handles.append(opt.register_step_post_hook(lambda *a: None))
        if why == "a global hook":
            handles.append(register_optimizer_step_pre_hook(lambda *a: None))
        return opt

    try:
        gn, _ = measured(make, aside=True)
    finally:
        for h in handles:
            h.remove()
    alone, _ = measured(lambda ps: torch.optim.SGD(ps, lr=0.1), aside=False)
    assert jobs == [] and torch.equal(gn, alone)


def test_an_optimizer_not_listed_measures_on_the_training_thread(jobs):
    class MySGD(torch.optim.SGD):  # (a subclass may write the gradients in its own step)
        pass

    gn, _ = measured(lambda ps: MySGD(ps, lr=0.1), aside=True)
    assert jobs == [] and gn is not None


def test_a_step_that_raises_inside_the_optimizer_leaves_no_job_running(jobs):
    m = model_and_grads()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    probe = GradProbe(list(m.parameters()), opt, aside=True)
    probe.begin()
    opt.param_groups[0]["betas"] = None  # Adam's step raises, after the step pre-hook
    with pytest.raises(TypeError):
        opt.step()
    gn, _, _ = probe.end(measure=False)
    probe.close()
    assert len(jobs) == 1 and probe._job is None and gn is not None
