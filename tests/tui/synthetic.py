"""A synthetic forensics table of any size (numpy only), for the 200,000-op speed checks."""

from __future__ import annotations

import numpy as np

from replay.store.forensics import write_forensics

MODULES = ["", "enc", "enc.layers.0", "enc.layers.0.attn", "enc.layers.0.mlp", "head"]
OPS = ["aten::mm", "aten::add", "aten::gelu", "aten::softmax", "aten::log", "aten::sum"]


def synthetic_tables(n_ops: int, culprit: int) -> dict:
    rng = np.random.default_rng(0)
    phase = np.zeros(n_ops, dtype=np.uint8)
    phase[n_ops // 3 :] = 1
    phase[n_ops * 9 // 10 :] = 2
    status = np.zeros(n_ops, dtype=np.uint8)
    status[culprit] = 1
    status[culprit + 1 : culprit + 2000 : 7] = 2
    stats = rng.normal(size=(n_ops, 10))
    stats[:, 9] = 64
    modules = np.asarray(rng.integers(-1, len(MODULES), n_ops), dtype=np.int32)
    ops = {
        "phase": phase,
        "name": rng.integers(0, len(OPS), n_ops).astype(np.int32),
        "module": modules,
        "source": np.zeros(n_ops, dtype=np.int32),
        "stack": np.zeros(n_ops, dtype=np.int32),
        "node": np.full(n_ops, -1, dtype=np.int32),
        "status": status,
        "inputs": np.zeros(n_ops, dtype=np.int32),
        "outputs": np.zeros(n_ops, dtype=np.int32),
        "stats": stats,
        "hist": rng.random((n_ops, 16)).astype(np.float32),
        "mem_bytes": np.cumsum(rng.integers(-100, 110, n_ops)).astype(np.int64),
        "time_ns": np.full(n_ops, 1000, dtype=np.int64),
    }
    k = len(MODULES)
    return {
        "verdict": {
            "step": 6,
            "kind": "nonfinite",
            "op_index": culprit,
            "op": "aten::log",
            "phase": "forward",
            "module": "enc.layers.0.mlp",
            "samples": [1],
        },
        "ops": ops,
        "strings": {
            "ops": OPS,
            "modules": MODULES,
            "locations": ["/x/model.py:3:forward"],
            "stacks": ["[0]"],
            "shapes": ["float32[8,8]@cpu"],
            "module_kinds": ["M"],
            "params": ["w"],
            "nodes": [],
        },
        "modules": {
            "name": np.arange(k, dtype=np.int32),
            "kind": np.zeros(k, dtype=np.int32),
            "parent": np.array([-1, 0, 1, 2, 2, 0], dtype=np.int32),
            **{
                c: np.ones(k)
                for c in ("act_mean", "act_std", "act_absmax", "act_zero_frac", "act_nonfinite")
            },
            "n_ops": np.ones(k, dtype=np.int32),
        },
        "params": {
            "name": np.zeros(1, dtype=np.int32),
            "numel": np.ones(1, dtype=np.int64),
            "requires_grad": np.ones(1, bool),
            "has_grad": np.ones(1, bool),
            **{
                c: np.ones(1)
                for c in (
                    "grad_norm",
                    "grad_nan",
                    "grad_inf",
                    "weight_norm",
                    "weight_mean",
                    "weight_std",
                    "update_norm",
                    "update_ratio",
                )
            },
        },
        "memory": {
            "peak_bytes": int(ops["mem_bytes"].max()),
            "peak_op": int(ops["mem_bytes"].argmax()),
            "largest": [],
        },
        "sources": {"/x/model.py": {"sha256": "", "lines": {"3": "    return x.log()"}}},
        "batch": {},
    }


def write_synthetic(path: str, run_id: str, n_ops: int = 200_000) -> int:
    """Write ``path``; returns the culprit's op index."""
    culprit = n_ops * 3 // 4
    write_forensics(path, run_id=run_id, step=6, tables=synthetic_tables(n_ops, culprit))
    return culprit
