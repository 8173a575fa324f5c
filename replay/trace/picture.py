"""The step's full picture besides the op table: parameters (grad, weight, update), the batch
per sample, and the tensors present before the step (for the origins of non-finite values)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, TypedDict

import numpy as np
import torch

from replay.store.forensics import PARAM_COLUMNS
from replay.store.tree import Key, leaf_path, leaves
from replay.trace.origins import Storages, storage_key, storages
from replay.trace.stats import floating, real_parts, stored_values

__all__ = [
    "ParamPicture",
    "BatchPicture",
    "BatchLeaf",
    "BatchNonFinite",
    "batch_leaves",
    "batch_picture",
    "batch_nonfinite",
    "present_keys",
    "mask_buffer_keys",
]

NAN = float("nan")
N_POSITIONS = 8  # positions listed per non-finite batch tensor


class BatchNonFinite(TypedDict):
    """A floating tensor of the batch holding NaN/Inf (the verdict's ``data.tensors``)."""

    name: str  # batch[0], batch['x']
    path: str  # as batch_leaves says
    shape: list[int]
    dtype: str
    nan: int
    posinf: int
    neginf: int
    count: int
    positions: list[list[int]]  # the first N_POSITIONS, as index lists


class PerSample(TypedDict):
    mean: list[float]
    absmax: list[float]
    nonfinite: list[int]


class _Leaf(TypedDict):
    path: str
    shape: list[int]
    dtype: str


class BatchLeaf(_Leaf, total=False):
    """A tensor leaf of the batch; ``per_sample`` when its dim 0 is the batch size."""

    per_sample: PerSample


class BatchPicture(TypedDict):
    """The sidecar's ``/batch``: ``culprits`` are the culprit samples once they are known
    (``TraceResult.set_samples``)."""

    batch_size: int | None
    leaves: list[BatchLeaf]
    culprits: list[int] | list[list[int]]


class _GradStats(NamedTuple):
    """A parameter's gradient when the optimizer started (or at the end of the step): its
    columns of ``/params``."""

    has_grad: bool
    grad_norm: float  # of its finite part; NaN when nothing is finite
    grad_nan: float
    grad_inf: float


_NO_GRAD = _GradStats(False, NAN, NAN, NAN)


def _name(keys: tuple[Key, ...]) -> str:
    """A leaf as the code reaching it reads: ``batch[0]``, ``batch['x']``, ``batch.state``."""
    parts = {"map": "[{!r}]", "seq": "[{}]", "attr": ".{}"}
    return "batch" + "".join(parts[kind].format(k) for kind, k in keys)


def batch_leaves(batch: object) -> list[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor leaf of a nested batch; paths as ``leaf_path`` says:
    ``x``, ``[0]``, ``inputs[1].ids``."""
    return [(leaf_path(k), t) for k, t in leaves(batch) if isinstance(t, torch.Tensor)]


def batch_nonfinite(batch: object) -> list[BatchNonFinite]:
    """Every floating tensor of the batch that holds NaN/Inf: where it sits in the batch
    (``name``: ``batch[0]``, ``batch['x']``; ``path``: as ``batch_leaves`` says), its shape, how
    many NaN, +inf and -inf it holds, and the first ``N_POSITIONS`` positions (index lists)."""
    out: list[BatchNonFinite] = []
    with torch.no_grad():
        for p, t in leaves(batch):
            if not isinstance(t, torch.Tensor) or not floating(t) or not t.numel():
                continue
            bad = ~torch.isfinite(t.detach())
            if not bad.any():
                continue
            pos = torch.nonzero(bad)
            nan = torch.isnan(t)  # (a complex element: NaN, else +inf, else -inf by its parts)
            x = real_parts(t.detach())
            posinf = (x == math.inf).any(-1) & ~nan if t.is_complex() else x == math.inf
            out.append(
                {
                    "name": _name(p),
                    "path": leaf_path(p),
                    "shape": list(t.shape),
                    "dtype": str(t.dtype)[6:],
                    "nan": int(nan.sum()),
                    "posinf": int(posinf.sum()),
                    "neginf": int((bad & ~nan & ~posinf).sum()),
                    "count": int(pos.shape[0]),
                    "positions": pos[:N_POSITIONS].tolist(),
                }
            )
    return out


def mask_buffer_keys(model: torch.nn.Module) -> Storages:
    """Storages of floating buffers (not parameters) whose only non-finite values are ``-inf``:
    an additive attention mask registered with ``register_buffer``, written on purpose."""
    params = {storage_key(p) for p in model.parameters()}
    masks: list[torch.Tensor] = []
    with torch.no_grad():
        for b in model.buffers():
            if not b.is_floating_point() or not b.numel() or torch.isfinite(b).all():
                continue
            k = storage_key(b)
            if k is not None and k not in params and not (torch.isnan(b) | (b == math.inf)).any():
                masks.append(b)
    return storages(masks)


def present_keys(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    others: Sequence[object] = (),
) -> Storages:
    """Storages of parameters, gradients, buffers and optimizer state before the step, of the
    model and optimizer and of ``others`` (the run's other models and optimizers)."""
    modules = [model, *(o for o in others if isinstance(o, torch.nn.Module))]
    opts = [optimizer, *(o for o in others if isinstance(o, torch.optim.Optimizer))]
    ts: list[torch.Tensor] = []
    for m in modules:
        ts += list(m.parameters()) + list(m.buffers())
        ts += [p.grad for p in m.parameters() if p.grad is not None]
    for opt in opts:
        for state in opt.state.values() if opt is not None else ():
            ts += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return storages(ts)


def batch_picture(
    batch: object, batch_size: int | None
) -> tuple[BatchPicture, dict[str, list[int]]]:
    """Per-sample mean, absmax and non-finite count of every tensor leaf whose dim 0 is the
    batch size; and which samples hold NaN/Inf (leaf path -> sample indices, none listed for a
    leaf without the batch dimension)."""
    leaves_out: list[BatchLeaf] = []
    bad: dict[str, list[int]] = {}
    with torch.no_grad():
        for path, t in batch_leaves(batch):
            leaf: BatchLeaf = {"path": path, "shape": list(t.shape), "dtype": str(t.dtype)[6:]}
            if batch_size and t.dim() >= 1 and t.shape[0] == batch_size and t.numel():
                f = t.detach().reshape(batch_size, -1).to(torch.float64)
                finite = torch.isfinite(f)
                nonfinite = (~finite).sum(1)
                g = torch.where(finite, f, torch.zeros((), dtype=f.dtype))
                count = finite.sum(1).clamp(min=1)
                leaf["per_sample"] = {
                    "mean": (g.sum(1) / count).tolist(),
                    "absmax": g.abs().amax(1).tolist(),
                    "nonfinite": nonfinite.tolist(),
                }
                idx = torch.nonzero(nonfinite).flatten().tolist()
                if idx:
                    bad[path] = idx
            elif floating(t) and not torch.isfinite(t).all():
                bad[path] = []
            leaves_out.append(leaf)
    return {"batch_size": batch_size, "leaves": leaves_out, "culprits": []}, bad


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().double()))


class ParamPicture:
    """Snapshot parameters before the step; grads when the optimizer starts; compare after."""

    def __init__(
        self, model: torch.nn.Module, others: Sequence[tuple[str, torch.nn.Module]] = ()
    ) -> None:
        """``others``: the run's other models by name (a GAN's ``netG``); their parameters are
        named ``netG.<parameter>``."""
        named = {id(p): (n, p) for n, p in model.named_parameters()}
        for prefix, mod in others:
            for n, p in mod.named_parameters():
                named.setdefault(id(p), (f"{prefix}.{n}", p))
        self.names = [n for n, _ in named.values()]
        self.params = [p for _, p in named.values()]
        with torch.no_grad():
            self.before = [p.detach().clone() for p in self.params]
        self.grads: list[_GradStats] | None = None

    def take_grads(self) -> None:
        if self.grads is not None:
            return
        rows: list[_GradStats] = []
        with torch.no_grad():
            for p in self.params:
                g = p.grad
                if g is None:
                    rows.append(_NO_GRAD)
                    continue
                # (a sparse gradient's stored values; a complex one's real and imaginary parts:
                # .double() dropped the imaginary part, with a warning in the user's output)
                f = real_parts(stored_values(g.detach())).double()
                nan, inf = float(torch.isnan(f).sum()), float(torch.isinf(f).sum())
                # The norm of the finite part; NaN when nothing is finite (0 would read "dead").
                norm = _norm(torch.nan_to_num(f, 0.0, 0.0, 0.0)) if nan + inf < f.numel() else NAN
                rows.append(_GradStats(True, norm, nan, inf))
        self.grads = rows

    def bad_grads(self) -> list[tuple[str, torch.Tensor]]:
        return [
            (n, p.grad)
            for n, p in zip(self.names, self.params)
            if p.grad is not None
            and floating(p.grad)
            and not torch.isfinite(stored_values(p.grad)).all()
        ]

    def bad_params(self) -> list[tuple[str, torch.Tensor]]:
        return [
            (n, p)
            for n, p in zip(self.names, self.params)
            if floating(p) and not torch.isfinite(p).all()
        ]

    def table(self) -> dict[str, np.ndarray]:
        """The sidecar's ``/params`` columns (the names are ``self.names``)."""
        self.take_grads()
        cols: dict[str, list[float]] = {k: [] for k in PARAM_COLUMNS if k != "name"}
        with torch.no_grad():
            for p, b, g in zip(self.params, self.before, self.grads or []):
                w = real_parts(b).double()  # weight statistics: the weights it started from
                cols["numel"].append(p.numel())
                cols["requires_grad"].append(p.requires_grad)
                for k, v in zip(g._fields, g):
                    cols[k].append(v)
                wn = _norm(w)
                cols["weight_norm"].append(wn)
                cols["weight_mean"].append(w.mean().item() if p.numel() else NAN)
                cols["weight_std"].append(w.std(correction=0).item() if p.numel() else NAN)
                un = _norm(real_parts(p.detach()).double() - w)
                cols["update_norm"].append(un)
                cols["update_ratio"].append(un / wn if wn > 0 and math.isfinite(wn) else NAN)
        return {k: np.asarray(v) for k, v in cols.items()}

    def release(self) -> None:
        self.before = []
        self.params = []
