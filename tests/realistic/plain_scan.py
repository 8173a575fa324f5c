"""A plain per-op scan, independent of ``replay.trace``: run a training program as it is, and
for every ``rec.step`` write down the first op, in execution order, whose floating output holds
NaN/Inf while its floating inputs and scalar arguments are all finite (uninitialised
allocations exempt). The tests check the tracer's verdict against it.

    python plain_scan.py OUT.json PROGRAM.py ARGS...
"""

from __future__ import annotations

import json
import math
import runpy
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ALLOC = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_",
         "resize_as_", "set_", "empty_permuted"}  # fmt: skip


def _finite(t: torch.Tensor) -> bool:
    return not t.is_floating_point() or bool(torch.isfinite(t).all())


class Scan(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.index = 0
        self.closure = -1
        self.first: dict | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = tree_flatten((args, kwargs))[0]
        ins = [t for t in flat if isinstance(t, torch.Tensor)]
        inputs_ok = all(_finite(t) for t in ins) and not any(
            isinstance(a, float) and not math.isfinite(a) for a in flat
        )
        out = func(*args, **kwargs)
        i, self.index = self.index, self.index + 1
        if self.first is None and inputs_ok and func._schema.name.split("::")[-1] not in ALLOC:
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if not outs:  # in-place ops return their first argument
                outs = ins[:1]
            if any(not _finite(t) for t in outs):
                node = torch._C._current_autograd_node()
                self.first = {
                    "op": func._schema.name,
                    "index": i,
                    "phase": "backward" if node is not None else "forward/other",
                    "closure": self.closure,
                }
        return out


def main() -> None:
    out_path, program, *args = sys.argv[1:]
    import replay

    steps: list[dict | None] = []
    scan_box: list[Scan] = []

    def count_closures(opt, a, kw):
        for j, c in enumerate(a):
            if callable(c) and not isinstance(c, torch.optim.Optimizer):

                def counted(c=c):
                    s = scan_box[-1]
                    outer, s.closure = s.closure, getattr(s, "calls", 0)
                    s.calls = s.closure + 1
                    try:
                        return c()
                    finally:
                        s.closure = outer

                return (*a[:j], counted, *a[j + 1 :]), kw
        return None

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(count_closures)
    original = replay.Recorder.step

    def step(self, *a, **kw):
        scan = Scan()
        scan_box.append(scan)
        try:
            with scan:
                return original(self, *a, **kw)
        finally:
            steps.append(scan.first)
            with open(out_path, "w") as f:
                json.dump(steps, f)

    replay.Recorder.step = step
    sys.argv = [program, *args]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
