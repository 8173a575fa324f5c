"""``make gpu-check``: what the GPU path does, settled in one run on a machine with a GPU.

    python tests/gpu/gpu_check.py [--report gpu-check-report.md] [--only reentry,nan]
    python tests/gpu/gpu_check.py --device cpu      # the same checks on the CPU (a dry run)

Each check records a small program (tests/gpu/check_programs.py) in a directory of its own and
asks ``replay`` about it (verify, bisect, the self-check's verdict). The checks are independent:
one that fails or times out does not stop the others. The report (Markdown, and JSON beside it
with ``.json`` for ``.md``) holds the device, the versions and each check's result, seconds and
detail, and a log beside it (``.log`` for ``.md``) with the full output of every command that
failed: a lent GPU machine's minutes are few, so one run must hold everything its failures need.
The three files are written again after every check (a run stopped at its limit keeps what it
found). Exit 0 when every check that ran passed, 1 when one failed, 3 (one line on stderr) when
there is no CUDA device. No command runs past ``--budget`` seconds (540) from the start: each
command's timeout is cut to what is left of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).with_name("check_programs.py")
NO_CUDA_EXIT = 3
SYNC_EXIT = 3  # check_programs.py's exit when rec.step synchronised
NORM_EXIT = 4  # and when the fused case's recorded gradient norms are not the unscaled ones
CUDA_RUN = Path(__file__).with_name("cuda_run.py")
_LOG_CHARS = 20_000  # of each stream of a failed command, in the log
CHECKS = (
    "reentry",
    "autocast",
    "conv",
    "sdpa",
    "compile",
    "nan",
    "scaler",
    "selfcheck",
    "sync",
    "ddp",
    "sparse",
    "fused",
    "spectral",
)


class CheckFailed(Exception):
    """A check's finding, one line."""


@dataclass
class Result:
    name: str
    result: str  # "pass" | "fail" | "skip"
    seconds: float
    detail: str


@dataclass
class Context:
    device: str
    root: Path  # one directory per check under it
    timeout: float  # seconds for each command
    gpus: int
    deadline: float  # time.monotonic() after which no command runs
    failures: list[str] = field(default_factory=list)  # each failed command's whole output

    def run(
        self, cwd: Path, *argv: str, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        )
        left = self.deadline - time.monotonic()
        if left < 2:
            raise CheckFailed(f"not run: the budget was spent before `{' '.join(argv[:3])}`")
        try:
            p = subprocess.run(
                [sys.executable, *argv],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=min(self.timeout, left),
            )
        except subprocess.TimeoutExpired as e:
            self._keep(cwd, argv, f"timed out after {e.timeout:.0f} s", e.stdout, e.stderr)
            raise
        if p.returncode not in ok:
            self._keep(cwd, argv, f"exited {p.returncode}", p.stdout, p.stderr)
            tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1][:400]
            raise CheckFailed(f"`{' '.join(argv[:3])}` exited {p.returncode}: {tail}")
        return p

    def _keep(self, cwd: Path, argv: tuple[str, ...], how: str, out: object, err: object) -> None:
        def text(x: object) -> str:
            s = x.decode(errors="replace") if isinstance(x, bytes) else str(x or "")
            return (
                s
                if len(s) <= _LOG_CHARS
                else f"[... {len(s) - _LOG_CHARS} chars]" + s[-_LOG_CHARS:]
            )

        self.failures.append(
            f"## {cwd.name}: `{' '.join(argv)}` {how}\n\n"
            f"### stdout\n{text(out)}\n### stderr\n{text(err)}\n"
        )

    def record(
        self, cwd: Path, case: str, *extra: str, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        return self.run(cwd, str(PROGRAMS), case, "run.h5", "--device", self.device, *extra, ok=ok)

    def replay_json(self, cwd: Path, *argv: str) -> dict[str, object]:
        p = self.run(cwd, "-m", "replay", *argv, "--json", ok=(0, 1))
        try:
            d: dict[str, object] = json.loads(p.stdout)
        except json.JSONDecodeError:
            tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1][:400]
            raise CheckFailed(f"`replay {argv[0]}` printed no report: {tail}") from None
        return d


def _verify(ctx: Context, cwd: Path) -> str:
    d = ctx.replay_json(cwd, "verify", "run.h5")
    device = str(d.get("device"))
    if d.get("deterministic") is not True:
        raise CheckFailed(f"verify on {device}: not bitwise: {json.dumps(d.get('cause'))[:400]}")
    if not device.startswith(ctx.device):
        raise CheckFailed(f"verify replayed on {device}, not {ctx.device}")
    return f"verify: bitwise on {device}, {len(d.get('steps') or [])} steps"  # type: ignore[arg-type]


def _recorded_then_verified(case: str) -> Callable[[Context, Path], str]:
    def check(ctx: Context, cwd: Path) -> str:
        ctx.record(cwd, case)
        return _verify(ctx, cwd)

    check.__doc__ = f"record the {case!r} program, then verify replays it bitwise"
    return check


def check_nan(ctx: Context, cwd: Path) -> str:
    """a batch overflows at step 7: bisect names the op, reproduced on the device"""
    ctx.record(cwd, "nan")
    d = ctx.replay_json(cwd, "bisect", "run.h5")
    if d.get("kind") != "nonfinite" or d.get("op") is None:
        raise CheckFailed(f"bisect named no op: kind {d.get('kind')}, op {d.get('op')}")
    if d.get("reproducible") is not True:
        raise CheckFailed(f"bisect did not reproduce the failure: {json.dumps(d)[:400]}")
    if not str(d.get("device")).startswith(ctx.device):
        raise CheckFailed(f"bisect replayed on {d.get('device')}, not {ctx.device}")
    op = d.get("op")
    name = op.get("name") if isinstance(op, dict) else op
    return f"bisect: step {d.get('first_bad_step')}, op {name}, reproduced bitwise on {d.get('device')}"


def check_fused(ctx: Context, cwd: Path) -> str:
    """AdamW(fused=True) under fp16 and a GradScaler: unscaled norms recorded, verified"""
    p = ctx.record(cwd, "fused", ok=(0, NORM_EXIT))
    if p.returncode == NORM_EXIT:
        line = next(x for x in p.stderr.splitlines() if x.startswith("NORM:"))
        raise CheckFailed(f"the recorded gradient norms are scaled: {line[5:].strip()[:400]}")
    return "recorded norms are the unscaled ones; " + _verify(ctx, cwd)


def check_spectral(ctx: Context, cwd: Path) -> str:
    """a complex (cuFFT) layer overflows at step 7: bisect names the complex multiply"""
    ctx.record(cwd, "spectral")
    d = ctx.replay_json(cwd, "bisect", "run.h5")
    # the batch's 1e37 overflows the multiply by a factor of ~3 to spare either way (at 3e36
    # only the irfft's sum overflows, at 1e38 the batch): rounding cannot move it; the irfft
    # named instead is the tracer not seeing complex values
    if (d.get("first_bad_step"), d.get("op"), d.get("reproducible")) != (7, "aten::mul", True):
        keys = ("first_bad_step", "op", "phase", "module", "reproducible", "device")
        raise CheckFailed(f"bisect: {json.dumps({k: d.get(k) for k in keys})}")
    return f"bisect: step 7, {d.get('op')} in {d.get('module')!r}, reproduced on {d.get('device')}"


def check_scaler(ctx: Context, cwd: Path) -> str:
    """tests/gpu/cuda_run.py: fp16 autocast, a GradScaler, a build_fn, a batch made on the GPU"""
    if ctx.device != "cuda":
        raise Skip("cuda_run.py is CUDA-only")
    ctx.run(cwd, str(CUDA_RUN), "run.h5", "--steps", "30")
    return _verify(ctx, cwd)


def check_selfcheck(ctx: Context, cwd: Path) -> str:
    """the self-check on: its verdict beside the recording says ok"""
    ctx.record(cwd, "reentry", "--self-check", str(ctx.timeout - 30))
    verdict = cwd / "run.selfcheck.json"
    d = json.loads(verdict.read_text()) if verdict.exists() else {}
    if d.get("status") != "ok":
        raise CheckFailed(
            f"self-check: {d.get('status', 'no verdict')}: {str(d.get('summary'))[:300]}"
        )
    return f"self-check: ok, {d.get('check')}, steps {d.get('steps')}, {d.get('seconds')} s"


def check_sync(ctx: Context, cwd: Path) -> str:
    """torch.cuda.set_sync_debug_mode("error") around rec.step: no synchronisation"""
    p = ctx.record(cwd, "sync", ok=(0, SYNC_EXIT))
    if p.returncode == SYNC_EXIT:
        line = next(x for x in p.stderr.splitlines() if x.startswith("SYNC:"))
        raise CheckFailed(f"the recorder synchronised: {line[5:].strip()[:400]}")
    return (
        "rec.step ran with sync debug mode 'error'"
        if ctx.device == "cuda"
        else "ran (no sync mode on the CPU)"
    )


def check_ddp(ctx: Context, cwd: Path) -> str:
    """DDP over NCCL on two GPUs (torchrun), verified rank by rank"""
    if ctx.device == "cuda" and ctx.gpus < 2:
        raise Skip(f"{ctx.gpus} GPU: DDP over NCCL needs two")
    launch = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")
    ctx.run(cwd, *launch, str(PROGRAMS), "ddp", "run.h5", "--device", ctx.device)
    return _verify(ctx, cwd)


class Skip(Exception):
    """A check that does not apply here, and why."""


CHECK_BODIES: dict[str, Callable[[Context, Path], str]] = {
    "reentry": _recorded_then_verified("reentry"),
    "autocast": _recorded_then_verified("autocast"),
    "conv": _recorded_then_verified("conv"),
    "sdpa": _recorded_then_verified("sdpa"),
    "compile": _recorded_then_verified("compile"),
    "nan": check_nan,
    "scaler": check_scaler,
    "selfcheck": check_selfcheck,
    "sync": check_sync,
    "ddp": check_ddp,
    "sparse": _recorded_then_verified("sparse"),
    "fused": check_fused,
    "spectral": check_spectral,
}


def run_check(ctx: Context, name: str) -> Result:
    cwd = ctx.root / name
    cwd.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        detail, result = CHECK_BODIES[name](ctx, cwd), "pass"
    except Skip as e:
        detail, result = str(e), "skip"
    except CheckFailed as e:
        detail, result = str(e), "fail"
    except subprocess.TimeoutExpired as e:
        detail, result = (
            f"timed out after {e.timeout:.0f} s: {' '.join(map(str, e.cmd[1:4]))}",
            "fail",
        )
    except Exception as e:  # noqa: BLE001  # a check's own bug fails that check, not the run
        detail, result = f"{type(e).__name__}: {e}"[:400], "fail"
        ctx.failures.append(f"## {name}: the check itself raised\n\n{traceback.format_exc()}\n")
    return Result(name, result, round(time.monotonic() - t0, 1), detail)


def environment(device: str) -> dict[str, object]:
    import torch

    env: dict[str, object] = {
        "device": device,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    if device == "cuda":
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def write_report(
    path: Path, env: dict[str, object], results: list[Result], failures: list[str]
) -> None:
    lines = ["# gpu-check", "", *(f"- {k}: {v}" for k, v in env.items()), ""]
    lines += ["| check | result | seconds | detail |", "|---|---|---|---|"]
    lines += [
        f"| {r.name} | {r.result} | {r.seconds} | {r.detail.replace('|', '/')} |" for r in results
    ]
    path.write_text("\n".join(lines) + "\n")
    body = {"environment": env, "checks": [asdict(r) for r in results]}
    path.with_suffix(".json").write_text(json.dumps(body, indent=1) + "\n")
    log = "\n".join(failures) if failures else "(no command failed)\n"
    path.with_suffix(".log").write_text(f"# gpu-check: the failed commands' output\n\n{log}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--report", default="gpu-check-report.md")
    p.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks")
    p.add_argument("--budget", type=float, default=540.0, help="seconds before no check starts")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds for one command")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in CHECK_BODIES]
    if unknown:
        print(
            f"gpu-check: no check named {', '.join(unknown)} (checks: {', '.join(CHECKS)})",
            file=sys.stderr,
        )
        return 2
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device here (--device cpu runs the checks on the CPU)",
            file=sys.stderr,
        )
        return NO_CUDA_EXIT
    gpus = torch.cuda.device_count() if a.device == "cuda" else 0
    root = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    ctx = Context(a.device, root, a.timeout, gpus, deadline=time.monotonic() + a.budget)
    report, env = Path(a.report), environment(a.device)
    results: list[Result] = []
    try:
        for name in names:
            if time.monotonic() > ctx.deadline - 2:
                r = Result(name, "fail", 0.0, f"not run: the {a.budget:.0f} s budget was spent")
            else:
                r = run_check(ctx, name)
                print(f"gpu-check: {r.name}: {r.result} ({r.seconds} s) {r.detail}", flush=True)
            results.append(r)
            write_report(report, env, results, ctx.failures)  # what a kill leaves
    finally:
        shutil.rmtree(root, ignore_errors=True)
    failed = [r.name for r in results if r.result == "fail"]
    print(
        f"gpu-check: {len(results) - len(failed)}/{len(results)} passed or skipped; report in {report}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
