"""What signing a recording costs (docs/trust.md), and what signing every slot would.

    PYTHONPATH=. python benchmarks/bench_signing.py [--repeat 2000]

A recording is signed once, when the file is created (on the recorder's writer thread):
``Recorder._signed`` encodes the signed fields (``replay.trust.signed_payload``) and computes one
HMAC-SHA256. Timed here on the metadata of a real small recording (the MLP of the benchmark
workloads, recorded first) with its recorded sources, and with sources 100x as large; then
the key's load (``user_key``, once per Recorder, on the training thread), verification at
replay (``standing``), and, for comparison, an HMAC-SHA256 per step slot over typical batch
payloads (what signing each slot where the CRC is would cost the writer) against the CRC32 it
would sit beside. Prints a markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_us(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _record(path: str) -> None:
    import torch

    import replay

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())

    def step(batch: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(batch).square().mean()
        loss.backward()
        opt.step()
        return loss

    with replay.Recorder(path, objects={"model": model, "optimizer": opt}, step_fn=step) as rec:
        for _ in range(3):
            rec.step(torch.randn(8, 16))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    os.environ["REPLAY_SELF_CHECK"] = "0"
    with tempfile.TemporaryDirectory() as d:
        os.environ["REPLAY_HOME"] = os.path.join(d, "home")
        from replay.store import open_recording
        from replay.trust import sign, signed_payload, standing, user_key

        run = os.path.join(d, "run.h5")
        _record(run)
        with open_recording(run) as rec:
            meta, sources = rec.meta, rec.sources
            run_id, version = rec.run_id, rec.format_version
        key = user_key()
        assert key is not None
        big = {p: t * 100 for p, t in sources.items()}
        rows = []
        for name, srcs in (("sign (this recording)", sources), ("sign (sources x100)", big)):
            size = len(signed_payload(meta, srcs, run_id, version))

            def once(srcs: object = srcs) -> object:
                blob = json.loads(json.dumps(meta))
                return sign(signed_payload(blob, srcs, run_id, version), key)

            rows.append((f"{name}, {size / 1024:.1f} KiB signed", _median_us(once, args.repeat)))
        rows.append(("load the key (once per Recorder)", _median_us(user_key, args.repeat)))
        rows.append(
            (
                "verify at replay (standing)",
                _median_us(lambda: standing(meta, sources, run_id, version), args.repeat),
            )
        )
        import hashlib
        import hmac

        for kib in (16, 146, 1024):
            payload = os.urandom(kib * 1024)
            mac = _median_us(lambda p=payload: hmac.new(key, p, hashlib.sha256).digest(), 500)
            crc = _median_us(lambda p=payload: zlib.crc32(p), 500)
            rows.append((f"per-slot HMAC-SHA256 of a {kib} KiB step (CRC32: {crc:.1f} us)", mac))
    print("| what | median |")
    print("|---|---|")
    for what, us in rows:
        print(f"| {what} | {us:.1f} us |")


if __name__ == "__main__":
    main()
