"""The report dataclasses read back what they write: ``from_json(d).to_json() == d`` for every
shape a command prints (keys, nesting, which keys are present), the verdict of a real traced
step included, and the sidecar's verdict reads back typed."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.reports import (
    BisectReport,
    DivergenceCause,
    OverfitReport,
    TraceReport,
    TraceVerdict,
    VerifyReport,
    WhatIfReport,
)
from replay.reports.ranks import MultiRankRun, RankFailure, RankReplay, RankSet
from replay.reports.whatif import Experiment, StepResult
from replay.trace import trace_step

SOURCE = {"file": "/abs/model.py", "line": 27, "function": "forward", "code": "return x.log()"}
CULPRIT = {
    "cause": "op",
    "op_index": 4,
    "op": "aten::log",
    "phase": "forward",
    "module": "head",
    "source": SOURCE,
    "executed_at": None,
    "made": "-inf",
    "made_from": "finite",
    "nan_from_inf": {
        "op_index": 5,
        "op": "aten::mul",
        "phase": "forward",
        "module": "",
        "source": SOURCE,
        "from": "-inf",
    },
    "data": None,
    "samples": [[2, 5]],
    "samples_exact": False,
    "sample_axes": [0, 1],
    "sample_sources": None,
    "closure": 1,
    "surfaced": {
        "op_index": 9,
        "op": "aten::mm",
        "phase": "backward",
        "module": "head",
        "source": SOURCE,
        "closure": None,
        "how": "raised RuntimeError on it",
    },
}
CAUSE = {
    "step": 7,
    "changed_files": ["/abs/train.py"],
    "snapshot": 10,
    "differs": [
        {"object": "optimizer", "names": ["state.0.exp_avg"], "count": 3, "max_abs_diff": 0.5}
    ],
    "kind": "outside_state",
    "summary": "state changed outside the step",
    "hint": "restore it",
}
BISECT = {
    "healthy": False,
    "kind": "nonfinite",
    "criterion": "NaN/Inf in the loss, the gradients or the parameters",
    "first_bad_step": 7,
    "symptom_step": 9,
    "exception": {"type": "RuntimeError", "message": "boom"},
    "deterministic": False,
    "reproducible": True,
    "divergence": {
        "step": 7,
        "column": "loss",
        "recorded": 1.0,
        "replayed": "nan",
        "abs_diff": None,
        "ulps": None,
    },
    "replayed_steps": 8,
    "rechecked_steps": 1,
    "snapshot": 5,
    "snapshots_checked": 1,
    "device": "cpu",
    "window": [0, 9],
    "checked": [0, 9],
    "loss": "nan",
    "grad_norm": 2.5,
    **{
        k: CULPRIT[k]
        for k in (
            "cause",
            "op_index",
            "op",
            "phase",
            "module",
            "source",
            "executed_at",
            "made",
            "made_from",
            "nan_from_inf",
            "data",
            "samples",
            "samples_exact",
            "sample_axes",
            "sample_sources",
            "closure",
            "surfaced",
        )
    },
    "forensics": "run.forensics.h5",
    "notes": ["a note"],
    "divergence_cause": CAUSE,
    "recording": "run.h5",
    "entry_files": ["/abs/train.py"],
}


# The rank-set parts (replay/reports/ranks.py) in the shapes a multi-rank replay writes them.
RANK_SET = {
    "spec": "run.h5",
    "ranks": [0, 1],
    "first_bad": {"step": 5, "ranks": [1], "kind": "nonfinite", "local": True},
    "replayed_rank": 1,
    "summary": "first bad at step 5 on rank 1 (loss)",
}
MULTI_RANK = {"world_size": 2, "backend": "gloo", "leader": 1, "approximate": False}
RANK_REPLAY = {
    "rank": 0,
    "recording": "run.rank0.h5",
    "replayed_steps": [4, 5],
    "runs": 2,
    "compared": 2,
    "deterministic": True,
    "divergence": None,
    "peer_failed_steps": [],
    "trace": {"op": None, "received": "through DDP's gradient all-reduce", "step": 5},
}


def roundtrip(cls, d):
    back = cls.from_json(json.loads(json.dumps(d))).to_json()
    assert back == d
    assert list(back) == list(d)  # the order the commands print too
    return back


def test_bisect_reports_of_every_shape_read_back_as_written():
    roundtrip(BisectReport, BISECT)
    healthy = {**BISECT, **{k: None for k in CULPRIT}, "healthy": True, "divergence_cause": None}
    roundtrip(BisectReport, healthy)
    alone = {
        **BISECT,
        "rank_set": {**RANK_SET, "first_bad": None, "replayed_rank": 0},
        "traced_loss": "nan",
        "approximate": True,
    }
    roundtrip(BisectReport, alone)
    together = {
        **BISECT,
        "rank": 1,
        "rank_set": RANK_SET,
        "multi_rank": MULTI_RANK,
        "ranks": {"0": RANK_REPLAY, "1": {k: v for k, v in RANK_REPLAY.items() if k != "trace"}},
    }
    roundtrip(BisectReport, together)


def test_each_rank_replay_reads_back_as_written():
    """A rank's own check in each shape its replay process writes: replayed with its peers,
    after ``whatif`` (no steps compared: the changes removed its failure) and ``export``."""
    roundtrip(RankReplay, RANK_REPLAY)
    whatif = {"rank": 1, "recording": "run.rank1.h5", "deterministic": False}
    diverged = {"step": 5, "column": "loss", "recorded": 1.5, "replayed": "nan"}
    diverged |= {"abs_diff": None, "ulps": None}
    whatif |= {"divergence": diverged, "removed_by": ["--skip-step 5"], "peer_failed_steps": []}
    roundtrip(RankReplay, whatif)
    export = {k: v for k, v in RANK_REPLAY.items() if k not in ("peer_failed_steps", "trace")}
    export |= {"export": {"out": "x", "step": 5}, "peer_failed_steps": [5]}
    roundtrip(RankReplay, export)
    assert RankSet.from_json(RANK_SET).first_bad == RankFailure(5, (1,), "nonfinite", True)


def test_whatif_reports_read_back_as_written_with_and_without_ranks():
    """``replay whatif --json`` of one process, and of a rank set replayed together (the
    leader's report with every rank's check: what the TUI's what-if panel reads back)."""
    base = Experiment("baseline", [StepResult(4, loss=2.5), StepResult(5, failed=True)], 5)
    fix = Experiment("--skip-step 5", [StepResult(4, loss=2.5), StepResult(5, skipped=True)])
    fix.removes_failure = True
    report = WhatIfReport(
        "run.h5", (0, 9), 4, 4, 5, "nonfinite", 5, base.steps, base, True, None, [fix]
    )
    roundtrip(WhatIfReport, report.to_json())
    report.multi_rank = MultiRankRun.from_json(MULTI_RANK)
    report.ranks = {"0": RankReplay.from_json(RANK_REPLAY)}
    assert roundtrip(WhatIfReport, report.to_json())["ranks"]["0"] == RANK_REPLAY


def test_every_divergence_cause_reads_back_as_written():
    roundtrip(DivergenceCause, CAUSE)
    raised = {
        "step": 3,
        "changed_files": [],
        "kind": "raised",
        "summary": "s",
        "hint": "h",
        "exception": {"type": "KeyError", "message": "'x'"},
    }
    roundtrip(DivergenceCause, raised)
    roundtrip(
        DivergenceCause,
        {"step": 3, "changed_files": [], "kind": "nondeterministic", "summary": "s", "hint": "h"},
    )
    none_left = {**CAUSE, "differs": []}
    del none_left["snapshot"]
    roundtrip(DivergenceCause, none_left)


def test_verify_and_trace_reports_read_back_as_written():
    step = {
        "step": 3,
        "match": False,
        "compared": True,
        "loss": "nan",
        "recorded_loss": 1.5,
        "param_fingerprint": 2.0,
        "recorded_param_fingerprint": 2.0,
        "exception": None,
    }
    verify = {
        "deterministic": False,
        "window": [0, 9],
        "device": "cpu",
        "replayed_steps": 10,
        "first_divergence": {
            "step": 3,
            "column": "param_fingerprint",
            "recorded": 2.5,
            "replayed": 2.25,
            "abs_diff": 0.25,
            "ulps": 4503599627370496,
            "carried_on": 0,
        },
        "steps": [step],
        "cause": CAUSE,
        "recording": "run.h5",
        "entry_files": [],
    }
    roundtrip(VerifyReport, verify)
    roundtrip(VerifyReport, {**verify, "cause": None, "approximate": True, "notes": ["alone"]})
    every = {"0": {k: v for k, v in RANK_REPLAY.items() if k != "trace"}}
    roundtrip(VerifyReport, {**verify, "multi_rank": MULTI_RANK, "ranks": every})
    trace = {
        "recording": "run.h5",
        "step": 7,
        "window": [0, 9],
        **{
            k: CULPRIT[k]
            for k in (
                "cause",
                "op_index",
                "op",
                "phase",
                "module",
                "source",
                "executed_at",
                "made",
                "made_from",
                "nan_from_inf",
                "closure",
                "surfaced",
                "data",
                "samples",
                "samples_exact",
                "sample_axes",
                "sample_sources",
            )
        },
        "trace_notes": ["n"],
        "forensics": "run.forensics.h5",
    }
    roundtrip(TraceReport, trace)
    roundtrip(TraceReport, {**trace, "traced_loss": "inf"})
    together = {"deterministic": True, "rank": 1, "rank_set": RANK_SET, "multi_rank": MULTI_RANK}
    roundtrip(TraceReport, {**trace, **together, "ranks": {"0": RANK_REPLAY}})


def test_overfit_report_reads_back_as_written():
    d = {
        "path": "run.h5",
        "step": 0,
        "iters": 3,
        "lr": 0.1,
        "first_loss": 2.0,
        "final_loss": 0.5,
        "min_loss": 0.5,
        "goal": 0.02,
        "overfits": True,
        "verdict": "still_falling",
        "progress": 0.3,
        "recent_drop": 0.4,
        "reached_at": None,
        "error": None,
        "curve": [2.0, 1.0, 0.5],
    }
    roundtrip(OverfitReport, d)


def test_a_real_verdict_reads_back_as_the_tracer_wrote_it(tmp_path):
    """Every key the tracer writes is a field of TraceVerdict, in the documented order, and the
    sidecar's verdict reads back typed."""
    from replay.store.forensics import ForensicsReader

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, batch):
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).log(), y)
        loss.backward()
        optimizer.step()
        return loss

    r = trace_step(model, opt, step, (-torch.ones(4, 8).abs() * 3, torch.zeros(4, 4)))
    v = TraceVerdict.from_json(r.verdict)
    assert v.to_json() == r.verdict and list(v.to_json()) == list(r.verdict)
    assert v.kind == "nonfinite" and v.op == "aten::log"
    r.write(tmp_path / "f.h5", run_id="abc", step=3)
    with ForensicsReader.open(str(tmp_path / "f.h5")) as f:
        back = TraceVerdict.from_json(f.verdict)
    assert back.step == 3 and back.op == v.op and back.op_index == v.op_index


def test_a_key_a_report_type_lacks_is_refused_where_it_would_be_lost():
    """A multi-rank replay's report comes back as JSON from the rank processes: a key its type
    has no field for would vanish from --json, so it is refused instead."""
    from replay.reports.verdict import only_known

    assert only_known(BisectReport, BISECT) is BISECT
    with pytest.raises(ValueError, match="BisectReport has no field for new_key"):
        only_known(BisectReport, {**BISECT, "new_key": 1})


def test_doctor_findings_read_back_as_written():
    from replay.reports import DoctorReport, Finding

    f = Finding("loss_rising", "warning", "the loss rises", {"slope": float("nan")}, "lower lr")
    d = DoctorReport("run.h5", [f]).to_json()
    assert d[0]["evidence"] == {"slope": "nan"} and d[0]["steps"] == []
    roundtrip_list = DoctorReport.from_json("run.h5", json.loads(json.dumps(d))).to_json()
    assert roundtrip_list == d


def test_a_whatif_report_of_a_rank_set_with_its_rank_set_reads_back():
    """Was: ``WhatIfReport.from_json`` took every rank-set part the JSON held, and the leader's
    report of a rank set replayed together holds ``rank_set``, which a whatif report has no
    field for: ``replay whatif`` of a DDP run ended in an internal error (TypeError)."""
    base = Experiment("baseline", [StepResult(4, loss=2.5), StepResult(5, failed=True)], 5)
    report = WhatIfReport(
        "run.h5", (0, 9), 4, 4, 5, "nonfinite", 5, base.steps, base, True, None, []
    )
    d = {**report.to_json(), "rank_set": RANK_SET}
    assert WhatIfReport.from_json(d).to_json() == report.to_json()
