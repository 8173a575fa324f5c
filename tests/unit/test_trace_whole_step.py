"""The first producer over the whole step (issue 33): closure calls, backward roots, values read
into Python, exceptions raised on a value made earlier; and the samples search's cuts and
failure signatures. Each expectation is checked against a plain loop over the same ops."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.trace import trace_step
from replay.trace.samples import (
    Failure,
    FailureProbe,
    candidate_axes,
    permute_batch,
    slice_batch,
)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x):
        return self.lin(x)


def lbfgs_step(model, optimizer, batch):
    x, y = batch

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.item()  # LBFGS reads it too; the test's own read
        loss.backward()
        return loss

    return optimizer.step(closure)


def make_lbfgs(lr):
    torch.manual_seed(0)
    model = Tiny().double()
    opt = torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=4)
    x = torch.randn(8, 3, dtype=torch.float64)
    return model, opt, (x, x.sum(1, keepdim=True))


def plain_first_producer(model, opt, batch):
    """(op name, closure call) of the first op making NaN/Inf from finite inputs, by a loop of
    its own: the closure's ops are counted by wrapping the closure by hand."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found = []
    call = [-1]

    class Scan(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ins = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            ok = all(not t.is_floating_point() or bool(t.isfinite().all()) for t in ins)
            out = func(*args, **kwargs)
            if ok and not found and isinstance(out, torch.Tensor) and out.is_floating_point():
                if not bool(out.isfinite().all()):
                    found.append((func._schema.name, call[0]))
            return out

    x, y = batch
    calls = [0]

    def closure():
        call[0] = calls[0]
        calls[0] += 1
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with Scan():
        opt.step(closure)
    return found[0] if found else None


def test_lbfgs_first_inf_of_a_later_closure_call_is_the_culprit_with_its_closure_index():
    model, opt, batch = make_lbfgs(1e200)
    expected = plain_first_producer(*make_lbfgs(1e200))
    assert expected is not None and expected[1] >= 1  # made in a later call, by construction
    r = trace_step(model, opt, lbfgs_step, batch)
    v = r.verdict
    assert v["kind"] == "nonfinite" and v["cause"] == "op"
    assert (v["op"], v["closure"]) == expected
    closure = r.ops["closure"]
    assert closure[v["op_index"]] == expected[1]
    assert closure.max() >= expected[1] and closure.min() == -1  # the update runs outside
    # every closure call's ops are contiguous and numbered in order
    calls = [int(k) for k in closure if k >= 0]
    assert calls == sorted(calls)
    # the old rule's answer, a later op the sinks saw, is kept as where it surfaced
    s = v["surfaced"]
    assert s is None or s["op_index"] > v["op_index"]


def test_lbfgs_healthy_step_numbers_its_closure_calls_and_blames_nothing():
    model, opt, batch = make_lbfgs(0.5)
    r = trace_step(model, opt, lbfgs_step, batch)
    assert r.verdict["kind"] == "none" and r.verdict["closure"] is None
    assert int(r.ops["closure"].max()) >= 1


class Reparam(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 2)
        self.dec = nn.Linear(2, 4)

    def forward(self, x):
        logvar = self.enc(x) * 1e3  # overflows exp below
        z = torch.exp(0.5 * logvar)  # EXP
        return torch.sigmoid(self.dec(z))


def bce_step(model, optimizer, batch):
    (x,) = batch
    optimizer.zero_grad()
    loss = F.binary_cross_entropy(model(x), x)
    loss.backward()
    optimizer.step()
    return loss


def test_an_op_that_raised_on_a_value_made_earlier_names_its_producer():
    torch.manual_seed(3)
    model = Reparam()
    with torch.no_grad():
        model.enc.weight.fill_(1.0)
    x = torch.rand(5, 4)
    r = trace_step(model, torch.optim.SGD(model.parameters(), lr=0.1), bce_step, (x,))
    v = r.verdict
    assert v["kind"] == "exception" and v["exception"]["type"] == "RuntimeError"
    assert v["op"] == "aten::exp" and v["cause"] == "op" and v["made"] == "+inf"
    raised = v["exception"]["op_index"]
    assert v["surfaced"]["op_index"] == raised
    assert v["surfaced"]["op"] == "aten::binary_cross_entropy"
    assert r.op_row(raised)["status"] == "raised"


def test_an_op_that_raised_on_finite_inputs_is_still_the_one_named():
    model = nn.Embedding(5, 2)

    def step(model, optimizer, batch):
        return model(batch).sum()

    r = trace_step(model, None, step, torch.tensor([1, 7]))
    v = r.verdict
    assert v["kind"] == "exception" and v["op"] == "aten::embedding"
    assert v["surfaced"] is None and v["cause"] is None


def test_failure_probe_names_the_raising_op_and_the_first_producer():
    probe = FailureProbe(nonfinite=True)
    with probe:
        a = torch.tensor([0.0, 1.0]).log()  # first producer
        b = a * 2.0  # a propagator
        try:
            torch.ones(2) @ torch.ones(3)
        except RuntimeError:
            pass
    assert probe.producer == "aten::log" and probe.raised is not None
    assert b.isinf().any()
    f = probe.failure({"type": "RuntimeError"}, False)
    assert f == Failure("exception", probe.raised, "RuntimeError")
    assert probe.failure(None, True) == Failure("nonfinite", "aten::log", None)
    assert probe.failure(None, False) is None


def test_flattened_targets_are_cut_along_the_same_axis_as_the_time_major_data():
    T, B = 4, 6
    data = torch.arange(T * B).reshape(T, B)
    targets = (data + 100).reshape(-1)  # word_language_model: targets.view(-1)
    batch = (data, targets)
    assert candidate_axes(batch) == [(0, T), (1, B)]
    sub_data, sub_targets = slice_batch(batch, [1, 4], axis=1)
    assert sub_data.tolist() == data[:, [1, 4]].tolist()
    # each kept target is still the target of the kept token: data + 100, position for position
    assert sub_targets.tolist() == (sub_data + 100).reshape(-1).tolist()
    rev_data, rev_targets = permute_batch(batch, 0)
    assert rev_targets.tolist() == (rev_data + 100).reshape(-1).tolist()
    # batch-major data with targets flattened [B*T] is cut along dim 0 the same way
    bm = (data.t().contiguous(), (data.t() + 100).reshape(-1))
    d0, t0 = slice_batch(bm, [2], axis=0)
    assert t0.tolist() == (d0 + 100).reshape(-1).tolist()


def test_a_per_sample_vector_of_a_time_major_batch_is_cut_along_its_own_axis():
    data = torch.zeros(3, 5)
    lengths = torch.arange(5)
    sub = slice_batch({"x": data, "lengths": lengths}, [0, 3], axis=1)
    assert sub["x"].shape == (3, 2) and sub["lengths"].tolist() == [0, 3]


def test_a_trace_streamed_through_small_chunks_matches_one_kept_in_memory(monkeypatch):
    import replay.trace.oplog as oplog
    import replay.trace.spool as spool

    model, opt, batch = make_lbfgs(1e200)
    whole = trace_step(model, opt, lbfgs_step, batch)
    assert whole.ops.spool.flushed == 0  # small enough to stay in memory
    monkeypatch.setattr(spool, "CHUNK_ROWS", 64)
    monkeypatch.setattr(oplog, "PROGRESS_ROWS", 16)
    model, opt, batch = make_lbfgs(1e200)
    streamed = trace_step(model, opt, lbfgs_step, batch)
    assert streamed.ops.spool.flushed > 0 and streamed.n_ops == whole.n_ops
    assert json.dumps(streamed.verdict, default=str) == json.dumps(whole.verdict, default=str)
    for k in ("phase", "name", "status", "closure", "stats", "hist", "module"):
        a, b = whole.ops[k], streamed.ops[k]
        assert np.array_equal(a, b, equal_nan=k in ("stats", "hist")), k
    i = streamed.verdict["op_index"]
    assert streamed.op_row(i)["status"] == "producer" == whole.op_row(i)["status"]


def test_the_spool_reads_and_patches_rows_on_both_sides_of_a_flush():
    from replay.store.forensics import STATS_COLUMNS
    from replay.trace.spool import OpColumns, OpSpool
    from replay.trace.stats import Stats

    sp = OpSpool(chunk_rows=4)
    for i in range(10):
        for k in sp.buf:
            if k == "stats":
                sp.buf[k].append(Stats(*([float(i)] * len(STATS_COLUMNS))))
            elif k == "hist":
                sp.buf[k].append(np.full(16, i, dtype=np.float32))
            else:
                sp.buf[k].append(i)
        if sp.full():
            sp.flush()
    assert sp.flushed == 8 and len(sp) == 10
    sp["status"][2] = 7  # in the files: a patch
    sp["status"][9] = 5  # in the buffer
    assert sp["status"][2] == 7 and sp["status"][3] == 3 and sp["status"][9] == 5
    cols = OpColumns(sp)
    assert cols["status"].tolist() == [0, 1, 7, 3, 4, 5, 6, 7, 8, 5]
    assert cols.read("stats", 7, 9)[:, 0].tolist() == [7.0, 8.0]
    sp.close()


def test_measuring_a_small_tensor_left_its_storage_unresizable():
    """FSDP2 frees an unsharded parameter by resizing its storage to zero after the forward;
    the tracer's numpy fast path had made that storage unresizable ("Trying to resize storage
    that is not resizable" in a traced FSDP2 step)."""
    import torch

    from replay.trace.stats import _small_array

    t = torch.randn(64, requires_grad=True)
    a = _small_array(t)
    assert a is not None and a.shape == (64,)
    t.untyped_storage().resize_(0)  # raised before: the storage was exported to numpy
    assert t.untyped_storage().nbytes() == 0


def test_a_warning_torch_raises_inside_a_traced_op_names_the_users_line_not_the_tracer():
    """``std()`` of one value warns from C++ ("degrees of freedom is <= 0"), naming the innermost
    Python frame. Was: while tracing that frame is the tracer's, so `replay bisect` printed the
    REINFORCE culprit's own warning at replay/trace/mode.py:332."""
    import warnings

    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, batch):
        returns = model(batch).squeeze(1)
        loss = (returns - returns.mean()) / returns.std()  # the line the warning names
        optimizer.zero_grad()
        loss.sum().backward()
        optimizer.step()

    line = step.__code__.co_firstlineno + 2
    before = warnings.showwarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = trace_step(model, opt, step, torch.randn(1, 3))
    assert warnings.showwarning is before  # put back when the trace ends
    dof = [w for w in seen if "degrees of freedom" in str(w.message)]
    assert dof and {(w.filename, w.lineno) for w in dof} == {(__file__, line)}, [
        (w.filename, w.lineno) for w in seen
    ]
    assert r.verdict["op"] == "aten::std"


class CheckpointedBlocks(nn.Module):
    """Two blocks run under activation checkpointing (HF's gradient_checkpointing, torchtitan's
    AC): the backward runs each block's forward again before its own backward."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(4, 4)  # (a reentrant checkpoint's input must require grad)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        x = self.inp(x)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.reentrant)  # the checkpoint's line
        return self.head(x)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_a_forward_recomputed_by_activation_checkpointing_is_attributed_where_it_runs(reentrant):
    """Was: the ops of a block's forward run again inside the backward were attributed to the
    node running them (module: the model, source: the checkpoint(...) line), and the backward of
    the recomputed graph (the reentrant flavour) to no module and no line: the function mode,
    which tags autograd nodes with their forward site, is off inside the backward. Now a
    recomputed op is in its own module at its own line, and so are the backward ops of the graph
    it makes; the phase stays backward (it runs there)."""
    torch.manual_seed(0)
    model = CheckpointedBlocks(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, batch):
        optimizer.zero_grad()
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    r = trace_step(model, opt, step, torch.randn(8, 4))
    rows = [r.op_row(i) for i in range(r.n_ops)]
    recomputed = [x for x in rows if x["phase"] == "backward" and x["op"] == "aten::tanh"]
    assert len(recomputed) == 2, [(x["op"], x["module"]) for x in rows]
    assert {x["module"] for x in recomputed} == {"blocks.0.1", "blocks.1.1"}
    # the forward line that ran it: Sequential's, in torch, is not user code; the innermost
    # user frame is the checkpoint's line inside our forward
    line = CheckpointedBlocks.forward.__code__.co_firstlineno + 5
    assert {x["source"] for x in recomputed} == {f"{__file__}:{line}:forward"}
    # every backward op of a block's parameters is in that block: addmm's mm and tanh's grad
    grads = [x for x in rows if x["op"] in ("aten::tanh_backward", "aten::mm")]
    unplaced = [(x["op"], x["node"], x["module"]) for x in grads if not x["module"]]
    assert grads and not unplaced, unplaced
    assert all(x["source"] for x in grads), [(x["op"], x["node"]) for x in grads if not x["source"]]


def test_a_step_taking_per_sample_gradients_with_torch_func_is_traced_whole():
    """vmap(grad(...)) over functional_call (DP-SGD). Was: the module hook measured a vmapped
    output, which has no storage; the read raised inside the traced step, which then stopped
    at its 11th op. Every op is traced now, and the module's activation is that of every
    sample."""
    from torch.func import functional_call, grad, vmap
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def one(params, x, y):
        return F.cross_entropy(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))

    def step(model, optimizer, batch):
        x, y = batch
        params = {k: v.detach() for k, v in model.named_parameters()}
        grads = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
        for name, p in model.named_parameters():
            p.grad = grads[name].mean(0)
        optimizer.step()

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += func.namespace != "profiler"  # (optimizer.step's markers)
            return func(*args, **(kwargs or {}))

    batch = (torch.randn(6, 4), torch.randint(0, 2, (6,)))
    step(model, opt, batch)  # (the first step makes the optimizer's state)
    with Count():
        step(model, opt, batch)
    r = trace_step(model, opt, step, batch)
    assert r.exception is None, r.exception
    assert r.n_ops == Count.ops
    names = r.strings["modules"]
    relu = r.modules["act_zero_frac"][names.index("1")]
    assert 0.0 < relu < 1.0  # measured over the samples' activations
