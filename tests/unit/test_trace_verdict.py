"""trace_step on real models whose failing op is known by construction.

Each test asserts op, phase, module and source line; expected lines are found from marker
comments in this file, never hard-coded."""

from __future__ import annotations

import copy
import inspect
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.trace import trace_step
from tests.conftest import run_env, run_py


def find_ops(r, op: str) -> list[int]:
    """Row indices of every op named ``op`` (``aten::log``) in a trace result."""
    if op not in r.strings["ops"]:
        return []
    return [int(i) for i in (r.ops["name"] == r.strings["ops"].index(op)).nonzero()[0]]


def line_of(obj, marker: str) -> int:
    lines, start = inspect.getsourcelines(obj)
    hits = [start + i for i, s in enumerate(lines) if f"# {marker}" in s]
    assert len(hits) == 1, marker
    return hits[0]


def sgd_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)  # MSE_LINE
    loss.backward()
    optimizer.step()
    return loss


def ce_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)  # CE_LINE
    loss.backward()
    optimizer.step()
    return loss


def run(model, batch, step=sgd_step, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    return trace_step(model, opt, step, batch)


# ---------------------------------------------------------------- forward: log(softmax) underflow
class LogSoftmaxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        return torch.log(torch.softmax(self.proj(x) * 1e4, dim=-1))  # LOG


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = LogSoftmaxHead()

    def forward(self, x):
        return self.head(self.body(x))


def nll_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.nll_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def test_log_of_underflowed_softmax_is_the_forward_producer():
    torch.manual_seed(0)
    r = run(Classifier(), (torch.randn(16, 8) * 10, torch.randint(0, 4, (16,))), step=nll_step)
    v = r.verdict
    assert v["kind"] == "nonfinite"
    assert (v["op"], v["phase"], v["module"]) == ("aten::log", "forward", "head")
    assert v["source"]["line"] == line_of(LogSoftmaxHead.forward, "LOG")
    assert v["sinks"][0] == "the loss"
    assert v["inputs"][0]["stats"]["nan"] == 0 and v["output"]["stats"]["neginf"] > 0
    assert any(p["op"] == "aten::nll_loss_forward" for p in v["propagators"])
    assert r.ops["status"][v["op_index"]] == 1
    # the softmax before it was finite, so it is not blamed
    assert all(r.ops["status"][i] == 0 for i in find_ops(r, "aten::_softmax"))


# ---------------------------------------------------------------- backward: hand-written norm at 0
class HandNorm(nn.Module):
    def forward(self, h):
        return torch.sqrt((h**2).sum(-1))  # NORM


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, bias=False)
        self.norm = HandNorm()

    def forward(self, x):
        return self.norm(self.lin(x))


def test_hand_written_norm_at_zero_fails_in_backward_with_a_finite_loss():
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    x[3] = 0.0  # an exact zero row: the norm's gradient is 1/0
    r = run(NormNet(), (x, torch.zeros(8)))
    v = r.verdict
    assert v["kind"] == "nonfinite" and v["sinks"][0].startswith("gradients")
    assert (v["op"], v["phase"], v["module"]) == ("aten::div", "backward", "norm")
    assert v["autograd_node"] == "SqrtBackward0"
    assert v["created_at"]["line"] == line_of(HandNorm.forward, "NORM")
    # autograd's own formula ran it: no line of the program did (was: the loss.backward()
    # line, on the CPU only, where the engine runs on the thread that called backward)
    assert v["executed_at"] is None
    assert r.loss is not None and r.loss == r.loss  # finite loss

    # torch.linalg.vector_norm has a zero gradient at zero: no failure
    class GoodNorm(nn.Module):
        def forward(self, h):
            return torch.linalg.vector_norm(h, dim=-1)

    net = NormNet()
    net.norm = GoodNorm()
    assert run(net, (x, torch.zeros(8))).verdict["kind"] == "none"


# ---------------------------------------------------------------- the torch.where(sqrt) trap
class WhereSqrt(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        h = self.lin(x)
        return torch.where(h > 0, torch.sqrt(h), 0.0).sum(-1)  # WHERE


def test_where_sqrt_trap_nan_made_in_forward_reaches_the_gradients():
    torch.manual_seed(0)
    r = run(WhereSqrt(), (torch.randn(8, 4), torch.zeros(8)))
    v = r.verdict
    # sqrt of the negative entries is NaN in forward (masked out there); its backward turns
    # the masked zeros into NaN gradients
    assert v["kind"] == "nonfinite" and v["sinks"][0].startswith("gradients")
    assert (v["op"], v["phase"], v["module"]) == ("aten::sqrt", "forward", "")
    assert v["source"]["line"] == line_of(WhereSqrt.forward, "WHERE")
    assert any(p["phase"] == "backward" for p in v["propagators"])


class WhereSqrtZero(WhereSqrt):
    def forward(self, x):
        h = self.lin(x) ** 2  # >= 0; exactly 0 on a zero input row (no bias)
        return torch.where(h > 0, torch.sqrt(h), 0.0).sum(-1)  # WHERE0


def test_where_sqrt_trap_at_exact_zero_is_a_backward_producer():
    torch.manual_seed(0)
    model = WhereSqrtZero()
    model.lin = nn.Linear(4, 6, bias=False)
    x = torch.randn(8, 4)
    x[2] = 0.0
    r = run(model, (x, torch.zeros(8)))
    v = r.verdict
    assert v["kind"] == "nonfinite"
    assert (v["op"], v["phase"], v["module"]) == ("aten::div", "backward", "")
    assert v["created_at"]["line"] == line_of(WhereSqrtZero.forward, "WHERE0")
    assert v["inputs"][0]["stats"]["nan"] == 0  # produced from finite values: 0 / 0


# ---------------------------------------------------------------- custom autograd.Function
class BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (x - x)  # BADDIV


class Act(nn.Module):
    def forward(self, x):
        return BadGrad.apply(x)  # APPLY


class FnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = Act()

    def forward(self, x):
        return self.act(self.lin(x)).sum(-1)


def test_custom_function_backward_is_attributed_to_its_apply_line():
    torch.manual_seed(0)
    r = run(FnNet(), (torch.randn(8, 4), torch.zeros(8)))
    v = r.verdict
    assert (v["op"], v["phase"], v["module"]) == ("aten::div", "backward", "act")
    assert v["source"]["line"] == line_of(Act.forward, "APPLY")
    assert v["autograd_node"] == "BadGradBackward"
    assert v["executed_at"]["line"] == line_of(BadGrad.backward, "BADDIV")
    from replay.cli.render import render_verdict
    from replay.reports import BisectReport
    from replay.reports.verdict import known

    # what `replay bisect` prints: the Function's backward line under the forward one
    text = render_verdict(
        BisectReport.from_json(known(BisectReport, {**v, "first_bad_step": 0, "window": [0, 0]}))
    )
    assert f"ran at        {__file__}:{line_of(BadGrad.backward, 'BADDIV')} in backward" in text


# ---------------------------------------------------------------- complex tensors (a spectral layer)
class SpectralMix(nn.Module):
    """A Fourier layer (neuraloperator's SpectralConv): rfft, a complex weight per mode, irfft."""

    def __init__(self, scale: float):
        super().__init__()
        self.w = nn.Parameter(torch.full((1, 4, 5), scale * (1 + 1j), dtype=torch.cfloat))

    def forward(self, x):
        x_ft = torch.fft.rfft(x) * self.w  # MIX
        return torch.fft.irfft(x_ft, n=x.shape[-1])


def test_a_nan_made_in_a_complex_op_is_named_there_not_at_the_irfft_downstream():
    """The constant input's one mode, 16 + 0i, times 3e38 + 3e38i overflows float32 in the
    complex multiply; the irfft makes NaN of it. Was: complex tensors were not checked (not
    floating point), so the irfft that carried the overflow into a real tensor was named, "from
    finite inputs"; and the weight and gradient statistics cast the complex values to real,
    with torch's warning."""
    torch.manual_seed(0)
    x = torch.full((2, 4, 8), 2.0)
    r = run(SpectralMix(3e38), (x, torch.zeros(2, 4, 8)))
    v = r.verdict
    assert (v["op"], v["phase"], v["module"]) == ("aten::mul", "forward", ""), v["op"]
    assert v["source"]["line"] == line_of(SpectralMix.forward, "MIX")
    assert (v["made"], v["made_from"]) == ("+inf", "finite")


def test_a_healthy_complex_layer_is_healthy_and_its_parameters_are_measured_whole():
    torch.manual_seed(0)
    r = run(SpectralMix(0.5), (torch.randn(2, 4, 8), torch.zeros(2, 4, 8)))
    assert r.verdict["kind"] == "none"
    # the weight's statistics count its imaginary parts (a cast to real dropped them)
    assert r.params["weight_norm"][0] == pytest.approx(0.5 * math.sqrt(2 * 20), rel=1e-6)


# ---------------------------------------------------------------- divergence with a huge lr
def first_bad_leaf(model, x) -> str:
    """Independent truth: the first leaf module whose output is non-finite."""
    bad = []
    names = {m: n for n, m in model.named_modules()}
    hooks = [
        m.register_forward_hook(
            lambda m, i, o: bad.append(names[m]) if not torch.isfinite(o).all() else None
        )
        for m in model.modules()
        if not list(m.children())
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return bad[0]


def test_diverging_mlp_blames_the_forward_op_of_the_layer_that_overflows():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e6)
    batch = (torch.randn(16, 8), torch.randn(16, 1))
    for _ in range(10):
        saved = copy.deepcopy(model.state_dict())
        loss = sgd_step(model, opt, batch)
        if not torch.isfinite(loss):
            break
    else:
        pytest.fail("did not diverge")
    model.load_state_dict(saved)
    truth = first_bad_leaf(model, batch[0])
    v = trace_step(model, opt, sgd_step, batch).verdict
    assert v["kind"] == "nonfinite" and v["phase"] == "forward"
    assert v["module"] == truth
    assert v["op"] == "aten::addmm"
    assert v["source"]["line"] == line_of(sgd_step, "MSE_LINE")  # the model(x) call


# ---------------------------------------------------------------- exceptions
class HardView(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x.view(16, 8))  # VIEW


def test_hard_coded_view_meeting_a_smaller_batch_names_the_op_and_its_inputs():
    r = run(HardView(), (torch.randn(12, 2, 4), torch.zeros(12, 4)))
    v = r.verdict
    assert v["kind"] == "exception" and v["exception"]["type"] == "RuntimeError"
    assert (v["op"], v["phase"], v["module"]) == ("aten::view", "forward", "")
    assert v["source"]["line"] == line_of(HardView.forward, "VIEW")
    assert v["inputs"][0]["shape"] == [12, 2, 4]
    assert r.ops["status"][v["op_index"]] == 3
    assert r.exception["op_index"] == v["op_index"]


def test_label_out_of_range_for_cross_entropy():
    model = nn.Linear(8, 4)
    y = torch.tensor([0, 1, 2, 3, 10, 1, 0, 2])
    r = run(model, (torch.randn(8, 8), y), step=ce_step)
    v = r.verdict
    assert v["kind"] == "exception" and v["exception"]["type"] == "IndexError"
    assert v["op"] == "aten::nll_loss_forward" and v["phase"] == "forward"
    assert v["module"] is None  # the loss is computed outside the model
    assert v["source"]["line"] == line_of(ce_step, "CE_LINE")
    assert [i["shape"] for i in v["inputs"][:2]] == [[8, 4], [8]]
    assert v["previous"] and v["previous"][-1]["op_index"] == v["op_index"] - 1


def bce_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.binary_cross_entropy(torch.sigmoid(model(x)).squeeze(1), y)  # BCE_LINE
    loss.backward()
    optimizer.step()
    return loss


def test_a_loss_raising_on_nan_the_batch_held_is_blamed_on_the_data():
    """siamese_network's shape: a NaN image makes the sigmoid's output NaN, and BCE's range
    check raises. Was: the raising op named alone, cause null; the batch's NaN is the cause."""
    x = torch.randn(8, 4)
    x[5, 2] = float("nan")
    r = run(nn.Linear(4, 1), (x, torch.ones(8)), step=bce_step)
    v = r.verdict
    assert v["kind"] == "exception" and v["exception"]["type"] == "RuntimeError"
    assert (v["cause"], v["op"]) == ("data", "aten::binary_cross_entropy")
    assert [t["name"] for t in v["data"]["tensors"]] == ["batch[0]"]
    assert v["source"]["line"] == line_of(bce_step, "BCE_LINE")
    # a finite batch whose loss raises for another reason keeps cause null
    r = run(nn.Linear(4, 1), (torch.randn(8, 4), torch.full((8,), 2.0)), step=bce_step)
    assert r.verdict["kind"] == "exception" and r.verdict["cause"] is None


def test_python_error_before_any_op_names_the_line():
    def step(model, optimizer, batch):
        raise KeyError("no such field")  # PYERR

    r = trace_step(nn.Linear(2, 2), None, step, torch.zeros(2, 2))
    v = r.verdict
    assert v["kind"] == "exception" and v["op"] is None
    assert v["source"]["line"] == line_of(step, "PYERR")


# ---------------------------------------------------------------- no false alarms
class MaskedAttention(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        t = x.shape[1]
        scores = q @ k.transpose(-2, -1) / 8**0.5
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))  # MASK
        return self.out(torch.softmax(scores, dim=-1) @ v)


def test_attention_mask_with_minus_inf_is_no_false_alarm():
    torch.manual_seed(0)
    r = run(MaskedAttention(), (torch.randn(4, 6, 8), torch.randn(4, 6, 8)), opt=None)
    v = r.verdict
    assert v["kind"] == "none", v
    (mask_op,) = [i for i in find_ops(r, "aten::masked_fill") if r.ops["phase"][i] == 0]
    assert r.ops["status"][mask_op] == 4 and r.ops["stats"][mask_op][7] > 0  # neginf counted


def test_rnn_step_is_no_false_alarm():
    torch.manual_seed(0)
    model = nn.RNN(8, 16, batch_first=True)

    def step(model, optimizer, batch):
        optimizer.zero_grad()
        out, _ = model(batch)
        loss = out.pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        r = trace_step(model, torch.optim.Adam(model.parameters()), step, torch.randn(4, 5, 8))
        assert r.verdict["kind"] == "none"
        assert not (r.ops["status"] == 1).any()


def test_amp_bf16_autocast_with_grad_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")

    def step(model, optimizer, batch):
        x, y = batch
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    r = trace_step(model, opt, step, (torch.randn(8, 8), torch.randn(8, 1)), scaler=scaler)
    assert r.verdict["kind"] == "none"
    assert "bfloat16" in " ".join(r.strings["shapes"])
    assert (r.ops["phase"] == 2).any()  # the optimizer step ran and was traced


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own, on importing dynamo
def test_compiled_model_is_traced_eagerly():
    torch.manual_seed(0)
    compiled = torch.compile(Classifier())
    r = trace_step(
        compiled,
        torch.optim.SGD(compiled.parameters(), lr=0.1),
        nll_step,
        (torch.randn(16, 8) * 10, torch.randint(0, 4, (16,))),
    )
    v = r.verdict
    assert (v["op"], v["phase"], v["module"]) == ("aten::log", "forward", "head")
    assert v["source"]["line"] == line_of(LogSoftmaxHead.forward, "LOG")


# ---------------------------------------------------------------- infinities: producer vs converter
class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        return torch.softmax(self.lin(x) * 200, dim=-1)  # saturated: some probabilities are 0


def entropy_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    probs = model(x)
    entropy = -(probs * torch.log(probs)).sum(-1).mean()  # ENTROPY
    loss = F.nll_loss(torch.log(probs + 1e-8), y) - 0.01 * entropy
    loss.backward()
    optimizer.step()
    return loss


def test_log_of_zero_is_blamed_not_the_mul_that_turned_its_inf_into_nan():
    torch.manual_seed(0)
    x = torch.randn(8, 4) * 5
    model = Policy()
    with torch.no_grad():  # independent truth: some probability is exactly 0
        assert (model(x) == 0).any()
    r = run(model, (x, torch.randint(0, 6, (8,))), step=entropy_step)
    v = r.verdict
    assert (v["kind"], v["op"], v["phase"]) == ("nonfinite", "aten::log", "forward")
    assert v["source"]["line"] == line_of(entropy_step, "ENTROPY")
    assert v["output"]["stats"]["neginf"] > 0 and v["output"]["stats"]["nan"] == 0
    conv = v["nan_from_inf"]
    assert conv["op"] == "aten::mul" and conv["from"] == "-inf" and conv["op_index"] > v["op_index"]
    assert r.ops["stats"][conv["op_index"]][5] > 0  # the mul's output holds the NaN
    assert any("turned it into NaN" in n for n in v["notes"])
    assert r.ops["status"][v["op_index"]] == 1 and r.ops["status"][conv["op_index"]] == 2


class FullyMasked(MaskedAttention):
    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / 8**0.5
        keep = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        keep[2] = False  # query 2 may attend to nothing
        scores = scores.masked_fill(~keep, float("-inf"))
        return self.out(torch.softmax(scores, dim=-1) @ v)  # SOFTMAX


def test_softmax_over_a_fully_masked_row_is_the_producer_not_the_mask():
    torch.manual_seed(0)
    r = run(FullyMasked(), (torch.randn(4, 6, 8), torch.randn(4, 6, 8)))
    v = r.verdict
    assert (v["kind"], v["op"], v["phase"]) == ("nonfinite", "aten::_softmax", "forward")
    assert v["source"]["line"] == line_of(FullyMasked.forward, "SOFTMAX")
    assert v["nan_from_inf"] is None and any("on purpose" in n for n in v["notes"])
    (mask_op,) = [i for i in find_ops(r, "aten::masked_fill") if r.ops["phase"][i] == 0]
    assert r.ops["status"][mask_op] == 4


@pytest.mark.parametrize("how", ["where_scalar", "where_tensor", "full"])
def test_other_ways_of_writing_a_mask_are_no_false_alarm(how):
    class Att(MaskedAttention):
        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = q @ k.transpose(-2, -1)
            t = x.shape[1]
            keep = torch.ones(t, t, dtype=torch.bool).tril()
            if how == "where_scalar":
                scores = torch.where(keep, scores, float("-inf"))
            elif how == "where_tensor":
                scores = torch.where(keep, scores, torch.tensor(float("-inf")))
            else:
                scores = scores + torch.full((t, t), float("-inf")).triu(1)
            return self.out(torch.softmax(scores, dim=-1) @ v)

    torch.manual_seed(0)
    r = run(Att(), (torch.randn(4, 6, 8), torch.randn(4, 6, 8)))
    assert r.verdict["kind"] == "none", r.verdict
    assert not (r.ops["status"] == 1).any()


class BufferMaskAttention(MaskedAttention):
    """The causal mask as a float buffer of -inf above the diagonal (added to the scores)."""

    def __init__(self, t=6, empty_row=None):
        super().__init__()
        mask = torch.full((t, t), float("-inf")).triu(1)
        if empty_row is not None:
            mask[empty_row] = float("-inf")
        self.register_buffer("mask", mask)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) + self.mask
        return self.out(torch.softmax(scores, dim=-1) @ v)  # BUFSOFTMAX


def test_a_buffer_of_minus_inf_is_a_mask_not_state_from_an_earlier_step():
    torch.manual_seed(0)
    batch = (torch.randn(4, 6, 8), torch.randn(4, 6, 8))
    assert run(BufferMaskAttention(), batch).verdict["kind"] == "none"
    v = run(BufferMaskAttention(empty_row=3), batch).verdict
    assert (v["kind"], v["cause"], v["op"]) == ("nonfinite", "op", "aten::_softmax")
    assert v["made_from"] == "intentional"
    assert v["source"]["line"] == line_of(BufferMaskAttention.forward, "BUFSOFTMAX")


def test_a_model_compiled_inside_the_traced_step_is_traced_again_seeing_compiled_ops():
    """The tracer can skip dynamo's wrapper around its dispatch mode (9 us an op) where nothing
    was compiled; a step that builds ``torch.compile(model)`` on its first call compiles during
    the trace, and the unwrapped mode then saw 2 ops of 41: that trace says so
    (``CompiledDuringTrace``), and a trace with the wrapped mode names the op. (A child
    process: in this one an earlier test compiled.)"""
    code = """
import torch
from test_trace_verdict import Classifier, nll_step
from replay.trace import trace_step
from replay.trace.step import CompiledDuringTrace

def traced(direct):
    torch.manual_seed(0)
    net = Classifier()
    compiled = {}
    def step(model, opt, batch):
        if "net" not in compiled:
            compiled["net"] = torch.compile(model)
        return nll_step(compiled["net"], opt, batch)
    batch = (torch.randn(16, 8) * 10, torch.randint(0, 4, (16,)))
    return trace_step(net, torch.optim.SGD(net.parameters(), lr=0.1), step, batch,
                      direct_dispatch=direct)

try:
    traced(True)
    print("missed")
except CompiledDuringTrace:
    print("compiled")
r = traced(False)
print(r.n_ops, r.verdict["op"], r.verdict["module"])
"""
    p = run_py("-c", code, env={"PYTHONPATH": f"{Path(__file__).parent}:{run_env()['PYTHONPATH']}"})
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    assert first == "compiled"
    n_ops, op, module = second.split()
    assert int(n_ops) > 20
    assert (op, module) == ("aten::log", "head")


def test_the_unwrapped_dispatch_mode_is_only_for_steps_with_nothing_compiled():
    from replay.trace.dispatch import _DirectDispatchMode, compiled_frames, dispatch_mode
    from replay.trace.mode import Tracer

    torch.manual_seed(0)
    net = Classifier()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    compiled = torch.compile(Classifier())
    # (an earlier test in this process may have compiled frames: then neither is unwrapped)
    tracer = Tracer(net, opt, set(), set(), direct_dispatch=True)
    plain = dispatch_mode(tracer.off, tracer.on_op, [net, opt], direct=True)
    assert isinstance(plain, _DirectDispatchMode) == (compiled_frames() == 0)
    wrapped = dispatch_mode(tracer.off, tracer.on_op, [compiled, opt], direct=True)
    assert not isinstance(wrapped, _DirectDispatchMode)
    assert not isinstance(
        dispatch_mode(tracer.off, tracer.on_op, [net], direct=False), _DirectDispatchMode
    )
