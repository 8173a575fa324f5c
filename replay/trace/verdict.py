"""The verdict: which op is to blame, per ``docs/forensics.md`` ``/verdict``.

Rule (producer, not propagator; see ``origins.py`` for how origins are tracked):

1. The step raised: kind ``"exception"``, naming the op being dispatched when it raised (with its
   inputs) or, for an error raised in Python before any op, the user line from the traceback.
2. Otherwise look at the *sinks* in the order they are computed: the loss, then the gradients
   (when the optimizer starts, or at the end of the step), then the parameters after the update.
   With a GradScaler, non-finite gradients of a step the scaler skipped are normal and ignored.
   Nothing non-finite in any sink: kind ``"none"``; every non-finite op is exempt (status 4),
   however it got there (an attention mask's ``-inf``, RNN ``empty_like`` buffers).
3. The first bad sink's origins decide (``origins.py`` says how an op becomes one). If the batch
   (or state present before the step) is among them, the verdict says so and names the first op
   that consumed it. Otherwise the culprit is the earliest producer of class ``"real"``: the
   first op that made a non-finite value out of finite inputs and arguments (NaN, ``+inf`` or
   ``-inf``), or NaN out of infinities that were put there on purpose (a softmax over a fully
   masked row). When that producer made an infinity and a later op turned it into NaN
   (``0 * -inf`` in an entropy term ``-(p * log p)``), the verdict names that op too:
   ``nan_from_inf``. Failing a producer, an ``"intentional"`` origin (a non-finite value given
   as an argument, ``masked_fill(mask, -inf)``) that reached the sink as it was is named, with a
   note. Uninitialised allocations are never culprits: when only they reach a sink, the first
   op that consumed them is named, with a note.

4. Over the whole step (every forward, backward, closure call and update), the culprit is the
   *first* such producer in execution order among the origins of everything that noticed a
   non-finite value: the sinks above, each backward's root (a closure's loss that LBFGS turns
   into a Python number and never returns), every Python number read off a tensor
   (``.item()``), and the inputs of an op that raised. When the op rule 3 would name for the
   first sink (or the op that raised) is another, later one, the verdict names it as
   ``surfaced``: where the value was noticed. A step that raised on an input some producer of the
   step made non-finite names that producer (cause ``"op"``), the raising op as ``surfaced``;
   one that raised on NaN/Inf the batch held, with no producer, names the raising op, cause
   ``"data"`` (BCELoss's range check on a NaN image's output).

The verdict's ``cause`` says which case it was: ``"op"`` (a producer), ``"data"`` (the batch held
NaN/Inf: ``data`` lists its non-finite tensors, the op named only read it first), ``"state"``,
``"intentional"``, ``"uninitialised"``; null for healthy steps and for exceptions raised on
finite inputs.

Statuses: producers whose values reached a sink are 1, ops carrying those values (converters
included) 2, every other non-finite op is exempt (4), ops that raised are 3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.reports.verdict import TraceVerdict
from replay.store.contracts import OpStatus, Phase
from replay.store.forensics import PHASES
from replay.trace.findings import InputInfo
from replay.trace.mode import Tracer
from replay.trace.origins import BATCH, PRESENT
from replay.trace.picture import BatchNonFinite
from replay.trace.result import TraceException
from replay.trace.stats import stats_dict

__all__ = ["build_verdict"]

FINITE, PRODUCER, PROPAGATOR, RAISED, EXEMPT = (s.code for s in OpStatus)
N_PROPAGATORS = 8
N_PREVIOUS = 8


def _op_ref(tr: Tracer, i: int) -> dict[str, Any]:
    mod = tr.log.cols["module"][i]
    return {
        "op_index": i,
        "op": tr.log.name(i),
        "phase": PHASES[tr.log.cols["phase"][i]],
        "module": tr.scope.modules.items[mod] if mod >= 0 else None,
    }


def _describe_op(tr: Tracer, i: int, inputs: list[InputInfo], executed_at: int) -> dict[str, Any]:
    ref = _op_ref(tr, i)
    backward = tr.log.cols["phase"][i] == Phase.BACKWARD.code
    node = tr.log.cols["node"][i]
    src = tr.sites.locs.describe(tr.log.cols["source"][i])
    ref.update(
        source=src,
        created_at=src if backward else None,
        executed_at=tr.sites.locs.describe(executed_at),
        autograd_node=tr.sites.nodes.items[node] if node >= 0 else None,
        inputs=inputs,
    )
    return ref


def _closure_of(tr: Tracer, i: int) -> int | None:
    k = tr.log.cols["closure"][i]
    return k if k >= 0 else None


def _surfaced(tr: Tracer, i: int, how: str) -> dict[str, Any]:
    src = tr.sites.locs.describe(tr.log.cols["source"][i])
    return {**_op_ref(tr, i), "source": src, "closure": _closure_of(tr, i), "how": how}


def _first_real(tr: Tracer, origins: frozenset[int]) -> int | None:
    real = [o for o in origins if o >= 0 and tr.findings.origins.klass.get(o) == "real"]
    return min(real) if real else None


def _first_consumer(tr: Tracer, origin: int) -> int | None:
    for i in sorted(tr.findings.nonfinite):
        nf = tr.findings.nonfinite[i]
        if origin in nf.origins and (
            nf.role in ("propagator", "converter") or nf.klass == "intentional"
        ):
            return i
    return None


def _nan_from_inf(tr: Tracer, culprit: int, first: frozenset[int]) -> dict[str, Any] | None:
    """The first converter that turned the culprit's infinity into NaN, on the way to the sink."""
    origins = tr.findings.origins
    if origins.kind.get(culprit) not in ("inf", "neginf"):
        return None
    for i in sorted(o for o in first if o >= 0):
        if origins.klass.get(i) == "nan" and culprit in tr.findings.nonfinite[i].origins:
            src = tr.sites.locs.describe(tr.log.cols["source"][i])
            made = "+inf" if origins.kind[culprit] == "inf" else "-inf"
            return {**_op_ref(tr, i), "source": src, "from": made}
    return None


def _blame_data(v: dict[str, Any], data: list[BatchNonFinite] | None, then: str) -> None:
    """Cause ``data``: the batch held the NaN/Inf, ``data`` its non-finite tensors."""
    v.update(cause="data", data={"tensors": list(data or []), "sample_axes": None})
    names = ", ".join(d["name"] for d in data or []) or "the batch"
    v["notes"].append(
        f"the input batch is non-finite ({names}): it is a data bug; no op produced it, {then}"
    )


def build_verdict(
    tr: Tracer,
    *,
    sinks: list[tuple[str, frozenset[int]]],
    exception: TraceException | None,
    batch_nonfinite: dict[str, list[int]] | None,
    notes: list[str],
    data: list[BatchNonFinite] | None = None,
) -> dict[str, Any]:
    """The verdict, a JSON document (docs/forensics.md, ``/verdict``). ``sinks``: (name,
    origins) of each non-finite sink, in the order they were computed; ``batch_nonfinite``:
    the samples of each batch leaf that hold NaN/Inf; ``data``: the batch's non-finite tensors
    (``picture.batch_nonfinite``)."""
    v = TraceVerdict(
        exception=dict(exception) if exception is not None else None,
        batch_nonfinite={"leaves": batch_nonfinite} if batch_nonfinite else None,
        sinks=[s for s, _ in sinks],
        notes=list(notes),
    ).to_json()  # every key of /verdict, in its order
    status = tr.log.cols["status"]
    nft = tr.findings.nonfinite
    # every non-finite op is exempt unless what it carried reached a sink (below): set for all
    # of them at once, as they may be millions (spool.OpSpool.set_rows)
    tr.log.cols.set_rows("status", np.asarray(nft.index, dtype=np.int64), EXEMPT)
    for r in tr.findings.raised:
        status[r.index] = RAISED
    if exception is not None:
        v["kind"] = "exception"
        at = exception["op_index"]
        end = len(status) if at is None else at  # raised in Python: after the last op
        v["previous"] = [_op_ref(tr, j) for j in range(max(0, end - N_PREVIOUS), end)]
        if at is None:
            v["source"] = exception["source"]
            return v
        raised = next(r for r in tr.findings.raised if r.index == at)
        v["closure"] = _closure_of(tr, at)
        producer = _first_real(tr, raised.bad_origins)
        if producer is not None:
            # it raised on a value a producer of this step made: that producer is named
            v["cause"] = "op"
            _describe_culprit(tr, v, producer, producer)
            v["nan_from_inf"] = _nan_from_inf(tr, producer, raised.bad_origins)
            status[producer] = PRODUCER
            v["surfaced"] = _surfaced(tr, at, f"raised {exception['type']} on it")
            v["notes"].append(
                f"{v['op']} (op {producer}) made {v['made']} from finite inputs; "
                f"{tr.log.name(at)} (op {at}) raised on it"
            )
            return v
        v.update(_describe_op(tr, at, raised.inputs, raised.executed_at))
        if BATCH in raised.bad_origins:  # no producer: it raised on what the batch held
            _blame_data(v, data, f"{tr.log.name(at)} (op {at}) raised on what it became")
        return v
    if not sinks:
        if tr.findings.nonfinite:
            v["notes"].append(
                f"{len(tr.findings.nonfinite)} op(s) made non-finite values that never reached the loss, "
                "the gradients or the parameters (masks, uninitialised buffers): exempt"
            )
        return v
    v["kind"] = "nonfinite"
    first = sinks[0][1]
    noticed = frozenset().union(*(n.origins for n in tr.findings.noticed))
    reached = frozenset().union(*(o for _, o in sinks)) | noticed
    klass = tr.findings.origins.klass
    carried = {k for k, o in enumerate(nft.sets) if o & reached}
    tr.log.cols.set_rows("status", nft.rows_where(carried), PROPAGATOR)
    for i in sorted(o for o in reached if o >= 0):
        if i in nft and klass.get(i) == "real":
            status[i] = PRODUCER
    ops = sorted(o for o in first if o >= 0)
    real = [o for o in ops if klass.get(o) == "real"]
    intentional = [o for o in ops if klass.get(o) == "intentional"]
    culprit: int | None = None
    if BATCH in first:
        _blame_data(v, data, "the op named is the first that read it")
        culprit = _first_consumer(tr, BATCH)
    elif PRESENT in first:
        v["cause"] = "state"
        v["notes"].append(
            "parameters, gradients, buffers or optimizer state were already non-finite when "
            "this step began"
        )
        culprit = _first_consumer(tr, PRESENT)
    elif (culprit := _first_real(tr, reached)) is not None:
        v["cause"] = "op"
        if real and real[0] != culprit:
            v["surfaced"] = _surfaced(tr, real[0], f"first producer of what reached {sinks[0][0]}")
            v["notes"].append(
                f"{tr.log.name(culprit)} (op {culprit}) made the first "
                f"non-finite value of the step; {sinks[0][0]} got theirs from "
                f"{tr.log.name(real[0])} (op {real[0]}), later"
            )
        v["nan_from_inf"] = conv = _nan_from_inf(tr, culprit, reached)
        name = tr.log.name(culprit)
        if conv is not None:
            v["notes"].append(
                f"{name} (op {culprit}) made {conv['from']} from finite inputs; "
                f"{conv['op']} (op {conv['op_index']}) turned it into NaN"
            )
        elif culprit in tr.findings.origins.from_intentional:
            src = sorted(o for o in tr.findings.origins.from_intentional[culprit] if o >= 0)
            given = (
                f"{tr.log.name(src[0])} (op {src[0]})" if src else "a constant made before the step"
            )
            v["notes"].append(
                f"{name} (op {culprit}) made NaN out of infinities written on purpose by "
                f"{given}: e.g. a fully masked row"
            )
    elif intentional:
        v["cause"] = "intentional"
        culprit = intentional[0]
        v["notes"].append(
            f"a non-finite value written on purpose by {tr.log.name(culprit)}"
            f" (op {culprit}, a non-finite argument) reached {sinks[0][0]} unchanged"
        )
    elif ops:
        v["cause"] = "uninitialised"
        culprit = _first_consumer(tr, ops[0])
        v["notes"].append(
            f"only uninitialised buffers ({tr.log.name(ops[0])}, op {ops[0]}) reached "
            f"{sinks[0][0]}: the op named read memory it never wrote"
        )
    if culprit is None:
        v["notes"].append(f"{sinks[0][0]} is non-finite but no traced op explains it")
        return v
    nf = tr.findings.nonfinite[culprit]
    status[culprit] = PRODUCER if nf.role in ("producer", "exempt") else PROPAGATOR
    _describe_culprit(tr, v, culprit, culprit if culprit in nf.origins else next(iter(nf.origins)))
    return v


def _describe_culprit(tr: Tracer, v: dict[str, Any], culprit: int, origin: int) -> None:
    """The named op's description, output, what it made (and from what, when it made it:
    cause "op") and the ops after it that carried ``origin``'s non-finite value on, into ``v``."""
    nf = tr.findings.nonfinite[culprit]
    v.update(_describe_op(tr, culprit, nf.inputs, nf.executed_at))
    v["closure"] = _closure_of(tr, culprit)
    st = stats_dict(tr.log.cols.get("stats", culprit))
    v["output"] = {**(nf.output or {"shape": None, "dtype": None, "device": None}), "stats": st}
    made = [w for k, w in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf")) if st[k] > 0]
    v["made"] = "/".join(made) or None
    if v["cause"] == "op":
        v["made_from"] = (
            "intentional" if culprit in tr.findings.origins.from_intentional else "finite"
        )
    v["propagators"] = [
        _op_ref(tr, i)
        for i, later in sorted(tr.findings.nonfinite.items())
        if i > culprit and later.role in ("propagator", "converter") and origin in later.origins
    ][:N_PROPAGATORS]
