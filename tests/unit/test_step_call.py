"""How the recorder and the engine call ``step_fn`` (``capture/objects.py``'s ``StepCall``)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from replay.capture.objects import RunObjects, StepCall
from replay.errors import EntryPointError

model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
OBJECTS = RunObjects({"model": model, "optimizer": opt})


def test_a_one_parameter_step_gets_the_batch_whatever_its_name():
    """Was: a GAN's ``train_step(real)`` (model=netD, optimizer=optD) was called
    ``train_step(netD, optD, batch)`` and raised TypeError in the user's loop at step 0."""
    seen = []

    def train_step(real):
        seen.append(real)
        return real.sum()

    call = StepCall(train_step, OBJECTS)
    x = torch.ones(3)
    assert float(call(x, {"it": 4})) == 3.0 and seen == [x]


def test_a_step_with_the_batch_first_and_a_value_by_name():
    def step(data, scale=2.0):
        return data.sum() * scale

    call = StepCall(step, OBJECTS)
    assert float(call(torch.ones(2))) == 4.0
    assert float(call(torch.ones(2), {"scale": 3.0})) == 6.0


def test_the_positional_contract_and_a_closure_over_batch_are_kept():
    def full(model, optimizer, batch, lr=None):
        return (model, optimizer, batch, lr)

    assert StepCall(full, OBJECTS)(1, {"lr": 0.5}) == (model, opt, 1, 0.5)

    def with_a_value(model, optimizer, batch, it):  # was refused: `it` comes from rec.step
        return it

    assert StepCall(with_a_value, OBJECTS)(1, {"it": 3}) == 3

    def closure(batch):
        return batch

    assert StepCall(closure, OBJECTS)(7) == 7


def test_a_step_that_cannot_take_a_batch_is_refused_at_once():
    def step():
        return 0.0

    with pytest.raises(EntryPointError, match="takes no batch"):
        StepCall(step, OBJECTS)


def test_named_objects_and_a_step_without_a_batch_parameter_gets_it_in_its_first_other_one():
    """Was: an RL step ``episode(seed)`` (objects={"model": ..., "optimizer": ...}) was refused
    for want of a parameter named 'batch'."""
    named = RunObjects({"model": model, "optimizer": opt}, "named")

    def episode(seed):
        return seed

    assert StepCall(episode, named)(17) == 17

    def step(model, optimizer, data, it=0):
        return (model, optimizer, data, it)

    assert StepCall(step, named)(5, {"it": 2}) == (model, opt, 5, 2)

    def objects_only(model, optimizer):
        return 0.0

    with pytest.raises(EntryPointError, match="takes no batch"):
        StepCall(objects_only, named)


def test_a_parameter_nothing_fills_is_named_with_what_fills_it():
    """A GAN's ``step(D, G, opt_d, opt_g, batch)`` with its discriminator given as ``model``.
    Was: Python's "missing 1 required positional argument: 'D'", from inside the recorder."""
    named = RunObjects({"model": model, "optimizer": opt}, "named")

    def step(D, optimizer, batch, it):
        return (D, optimizer, batch, it)

    call = StepCall(step, named)
    with pytest.raises(TypeError, match=r"parameter 'D' is given nothing: .*objects=\{\.\.\., 'D'"):
        call(1, {"it": 0})
    assert call(1, {"it": 0, "D": "d"}) == ("d", opt, 1, 0)  # a per-step value fills it
    with pytest.raises(TypeError, match=r"parameter 'it' is given nothing: .*rec.step\(batch, it="):
        StepCall(lambda model, batch, it: it, named)(1, {})


def test_a_step_closure_over_another_module_than_the_step_before_is_named():
    """Layer-local training (mnist_forward_forward): each layer's ``train()`` hands
    ``replay.step`` a closure of the same code over itself and its own inputs. Was: taken for
    the same step, silently; a replay ran the second layer's steps with the first layer's
    closure. A closure made again over the same objects (timm's per-batch
    ``lambda batch: _backward(_forward(batch))``), or over a new dict of meters, is the same."""
    from replay.record.entry import changed_capture

    layers = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]

    def per_layer(layer, x):
        def step(i):
            return layer(x).sum()

        return step

    x = torch.zeros(1, 2)
    assert changed_capture(per_layer(layers[0], x), per_layer(layers[0], x)) is None
    assert changed_capture(per_layer(layers[0], x), per_layer(layers[1], x)) == "layer"
    assert changed_capture(per_layer(layers[0], x), per_layer(layers[0], x + 1)) == "x"

    def per_batch(net, meters, need_update):
        def _forward(batch):
            return net(batch)

        def _backward(loss):
            if need_update:
                opt.step()
            meters.append(float(loss))
            return loss

        return lambda batch: _backward(_forward(batch))

    assert changed_capture(per_batch(model, [], True), per_batch(model, [], False)) is None
    assert changed_capture(per_batch(model, [], True), per_batch(layers[0], [], True)) == (
        "_forward.net"
    )
    assert changed_capture(per_layer(layers[0], x), per_batch(model, [], True)) is None
    # the siamese example makes its loss again each epoch: no state, the same step
    assert (
        changed_capture(per_layer(torch.nn.BCELoss(), x), per_layer(torch.nn.BCELoss(), x)) is None
    )
    assert changed_capture(per_layer(layers[0], x), per_layer(layers[0], x.clone())) is None


def test_a_recorder_warning_is_shown_at_the_programs_line_however_deep_it_was_found():
    """Was: a warning found under ``replay.step`` (a step over another layer, state the
    Recorder does not hold) was shown at ``replay/__init__.py:71``, and the by-reference
    fallback at ``replay/record/recorder.py:458``: fixed stack levels, one frame short."""
    import inspect
    import os
    import warnings

    import replay.errors as errors

    deep = os.path.join(os.path.dirname(errors.__file__), "record", "deep_inside.py")
    code = "def inner():\n    warn_at_user_line('said')\ndef outer():\n    inner()\n"
    ns = {"warn_at_user_line": errors.warn_at_user_line}
    exec(compile(code, deep, "exec"), ns)  # two frames that stand for replay's own
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        ns["outer"]()
    assert [(w.filename, w.lineno, str(w.message)) for w in seen] == [(__file__, line, "said")]
    assert seen[0].category is errors.RecorderWarning


def test_state_a_step_given_to_the_recorder_reads_and_it_does_not_hold_is_named_when_made(tmp_path):
    """minGPT-ddp's Trainer: ``Recorder(..., step_fn=lambda batch: self._run_batch(*batch))``,
    its GradScaler on ``self`` and not among the objects. Was: said only of a step function
    handed to ``rec.step``; one given to the Recorder itself was never looked at, so a replay
    from a later snapshot would start with a fresh scaler and nobody was told."""
    from tests.conftest import run_py

    script = tmp_path / "trainer.py"
    script.write_text(
        "import torch, replay\n"
        "class Trainer:\n"
        "    def __init__(self):\n"
        "        self.model = torch.nn.Linear(2, 1)\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
        "        self.scaler = torch.amp.GradScaler('cpu')\n"
        "        self.rec = replay.Recorder('run.h5', model=self.model, optimizer=self.optimizer,\n"
        "                                   step_fn=lambda batch: self._run_batch(batch))\n"
        "    def _run_batch(self, x):\n"
        "        self.optimizer.zero_grad()\n"
        "        self.scaler.scale(self.model(x).sum()).backward()\n"
        "        self.scaler.step(self.optimizer)\n"
        "        self.scaler.update()\n"
        "t = Trainer()\n"
        "for i in range(2):\n"
        "    t.rec.step(torch.ones(4, 2))\n"
        "t.rec.close()\n"
    )
    p = run_py(str(script), cwd=tmp_path, env={"REPLAY_SELF_CHECK": "0"}, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if "the Recorder does not hold" in ln]
    assert len(said) == 1 and "self.scaler (GradScaler" in said[0], p.stderr[-2000:]
    assert said[0].startswith(f"{script}:7:"), said  # the line that made the Recorder


def test_a_frozen_module_whose_fingerprint_cannot_be_taken_is_said_at_once() -> None:
    """A module none of whose parameters trains is said only if the steps change it
    (record/unheld.py); one that cannot be fingerprinted (a meta tensor) cannot be compared
    later, so it is said at once, as any other state; one that can is compared at the step
    given, and said then only when it changed."""
    from replay.record.unheld import UnheldState

    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    odd = torch.nn.Linear(2, 2, device="meta").requires_grad_(False)

    def step(batch: Any) -> Any:
        with torch.no_grad():
            frozen(batch), odd(batch.to("meta"))
        return model(batch).sum()

    unheld = UnheldState()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        unheld.say(step, OBJECTS, 50)
        assert unheld.look_again_at == 50
        unheld.look_again()  # unchanged: nothing more
        assert unheld.look_again_at is None
    said = [str(w.message) for w in seen]
    assert len(said) == 1 and "odd (Linear" in said[0] and "frozen (Linear" not in said[0], said
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        unheld.say(step, OBJECTS, 50)  # (odd, said again: a new step function)
        with torch.no_grad():
            frozen.weight.add_(1.0)  # what an EMA does under no_grad
        unheld.look_again()
        said = [str(w.message) for w in seen][1:]
    assert len(said) == 1 and "frozen (Linear" in said[0] and "the steps changed it" in said[0]
