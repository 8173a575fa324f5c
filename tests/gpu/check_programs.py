"""The training programs ``make gpu-check`` records (tests/gpu/gpu_check.py), one small loop per
case. No ``build_fn``: replay runs this file again up to its Recorder (the default re-entry
path). ``--device cpu`` runs the same loop on the CPU (the dry run a CPU test exercises).

    python tests/gpu/check_programs.py CASE run.h5 [--device cuda] [--steps 12] [--self-check SECONDS]

Cases: ``reentry`` (a CPU batch moved to the device inside the step), ``autocast`` (bf16),
``conv`` (a cuDNN convolution and batch norm), ``sdpa`` (scaled-dot-product attention under
bf16 autocast), ``compile`` (``torch.compile``), ``nan`` (log of a softmax that underflows at step 7),
``sync`` (``torch.cuda.set_sync_debug_mode("error")`` around each ``rec.step``: exit 3 and one
``SYNC:`` line on stderr when the recorder synchronises), ``ddp`` (DDP over NCCL, under
``torchrun --nproc-per-node 2``; gloo on the CPU), ``sparse`` (a graph's sparse adjacency made on
the device, handed to the step as its batch: gcn's shape), ``fused`` (``AdamW(fused=True)`` under
fp16 autocast and a GradScaler, no clip: nanoGPT's spelling on a GPU without bf16; the recorded
gradient norms must be the unscaled ones the program measures: exit 4 and one ``NORM:`` line
when not), ``spectral`` (a Fourier layer: ``cfloat`` weights, cuFFT; its complex product
overflows at step 7).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

CASES = (
    "reentry",
    "autocast",
    "conv",
    "sdpa",
    "compile",
    "nan",
    "sync",
    "ddp",
    "sparse",
    "fused",
    "spectral",
)
SYNC_EXIT = 3
NORM_EXIT = 4

parser = argparse.ArgumentParser()
parser.add_argument("case", choices=CASES)
parser.add_argument("out")
parser.add_argument("--device", default="cuda")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument(
    "--self-check",
    type=float,
    default=0.0,
    metavar="SECONDS",
    help="on, training until its verdict",
)
args = parser.parse_args()

CASE = args.case
RANK = int(os.environ.get("LOCAL_RANK", "0"))
DEV = torch.device(f"cuda:{RANK}" if args.device == "cuda" else args.device)
CUDA = DEV.type == "cuda"
if CASE == "conv":  # what the docs ask of a run that is to replay bitwise on cuDNN
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


class Attention(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        y = self.out(y.transpose(1, 2).reshape(b, t, d))
        return self.head(y.mean(1))


class Spectral(nn.Module):
    """neuraloperator's SpectralConv1d in miniature: complex weights on an rfft's modes."""

    def __init__(self) -> None:
        super().__init__()
        self.lift = nn.Linear(32, 32)
        self.weights = nn.Parameter(8 * torch.randn(1, 32 // 2 + 1, dtype=torch.cfloat))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.fft.irfft(torch.fft.rfft(self.lift(x)) * self.weights, n=x.shape[-1])
        return self.head(F.gelu(h))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    if CASE == "conv":
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
    if CASE == "sdpa":
        return Attention()
    if CASE == "spectral":
        return Spectral()
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 10))


def make_batch(g: torch.Generator, it: int) -> tuple[torch.Tensor, ...]:
    """A batch made on the CPU (moved inside the step), except for ``sync``, whose step must
    not copy from pageable memory (the mode is about the recorder, not the program), and
    ``sparse``, whose graph is on the device before the step (the recorder copies it)."""
    if CASE == "sparse":
        adj = (torch.rand(16, 16, generator=g) < 0.2).float().to_sparse().to(DEV)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        return adj, x.to(DEV), y.to(DEV)
    shape = {"conv": (8, 3, 8, 8), "sdpa": (8, 6, 32)}.get(CASE, (16, 32))
    x = torch.randn(*shape, generator=g)
    if CASE == "nan" and it == 7:
        x *= 1e4  # the softmax underflows to 0: its log is -inf, times a 0 of the one-hot NaN
    if CASE == "spectral" and it == 7:
        x *= 1e37  # the rfft's modes times the weights overflow float32 in the complex multiply
    y = torch.randint(0, 10, (shape[0],), generator=g)
    if CASE == "sync":
        return x.to(DEV), y.to(DEV)
    return x, y


if CASE == "ddp":
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl" if CUDA else "gloo")
    if CUDA:
        torch.cuda.set_device(DEV)
    model: nn.Module = DDP(build_model().to(DEV), device_ids=[RANK] if CUDA else None)
else:
    model = build_model().to(DEV)
if CASE == "compile":
    # inductor on a GPU; on the CPU dry run aot_eager (no C++ compiler, seconds not minutes)
    model = torch.compile(model, backend="inductor" if CUDA else "aot_eager")  # type: ignore[assignment]
if CASE == "fused":
    optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
AUTOCAST = CASE in ("autocast", "sdpa")
# fp16 under a GradScaler: a fused optimizer unscales inside its own step
SCALER = torch.amp.GradScaler(DEV.type, init_scale=2.0**12) if CASE == "fused" else None
NORMS: list[float] = []  # the fused case's own unscaled gradient norms, step by step


def train_step(batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    *adj, x, y = batch
    x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
    if adj:  # one step of message passing (dense: the sparse kernels may use atomics)
        x = adj[0].to_dense() @ x + x
    optimizer.zero_grad(set_to_none=True)
    if SCALER is not None:
        with torch.autocast(DEV.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x).float(), y)
        SCALER.scale(loss).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(
            torch.stack(torch._foreach_norm(grads)), dtype=torch.float64
        )
        NORMS.append(float(norm) / SCALER.get_scale())  # (the program's own reads: it may sync)
        SCALER.step(optimizer)
        SCALER.update()
        return loss
    with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=AUTOCAST):
        logits = model(x).float()
        if CASE == "nan":  # cross-entropy written out, as many a program does
            loss = -(F.one_hot(y, 10) * torch.log(torch.softmax(logits, -1))).sum(1).mean()
        else:
            loss = F.cross_entropy(logits, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    optimizer.step()
    return loss


def checking(deadline: float) -> bool:
    """True while the self-check has left no verdict and ``deadline`` is ahead (a check ends
    with the run it checks: the run trains on until it has said)."""
    if time.monotonic() > deadline:
        return False
    time.sleep(0.01)
    try:
        with open(args.out.removesuffix(".h5") + ".selfcheck.json") as fh:
            return bool(json.load(fh)["status"] == "running")
    except (OSError, ValueError, KeyError):
        return True


def main() -> int:
    g = torch.Generator().manual_seed(1 + RANK)
    synced: list[str] = []
    with replay.Recorder(
        args.out,
        objects={"model": model, "optimizer": optimizer}
        if SCALER is None
        else {"model": model, "optimizer": optimizer, "scaler": SCALER},
        step_fn=train_step,
        # with the self-check on, no later check within the run (its snapshot would be at step
        # 30,000): the run trains until the first verdict, and nothing outlives it
        snapshot_every=10_000 if args.self_check else 4,
        raise_on_nonfinite=False,
        self_check=args.self_check > 0,
    ) as rec:
        deadline = time.monotonic() + args.self_check
        it = 0
        while it < args.steps or (args.self_check and checking(deadline)):
            batch = make_batch(g, it)
            if CASE == "sync" and CUDA:
                torch.cuda.synchronize()  # nothing of the program's left in flight
                torch.cuda.set_sync_debug_mode("error")
            try:
                rec.step(batch)
            except RuntimeError as e:
                if CASE != "sync":
                    raise
                synced.append(f"step {it}: {str(e).splitlines()[0][:300]}")
            finally:
                if CASE == "sync" and CUDA:
                    torch.cuda.set_sync_debug_mode("default")
            it += 1
    if CASE == "ddp":
        torch.distributed.destroy_process_group()
    if synced:
        print(f"SYNC: rec.step synchronised {len(synced)} times; {synced[0]}", file=sys.stderr)
        return SYNC_EXIT
    if NORMS:
        from replay.store import open_recording

        with open_recording(args.out) as r:
            recorded = [float(v) for v in r.health()["grad_norm"]]
        off = [(i, a, b) for i, (a, b) in enumerate(zip(recorded, NORMS)) if abs(a - b) > 1e-4 * b]
        if len(recorded) != len(NORMS) or off:
            print(
                f"NORM: recorded {recorded[:3]}, the program's {NORMS[:3]}; off {off[:2]}",
                file=sys.stderr,
            )
            return NORM_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
