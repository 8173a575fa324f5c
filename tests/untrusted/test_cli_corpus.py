"""Every crafted file through `replay info` and `replay doctor` (and `verify`/`bisect` for the
ones that must be refused before any replay): the documented exit code, one error line naming
what is wrong, no traceback, no hang, bounded memory, and nothing a terminal would act on.

Each case runs in this process (``replay_here``: the console entry point under click's
``CliRunner``, a deadline against a hang); bounded memory is checked by one child per command
that reads every case under a 2 GiB address-space limit.

issue 23: "A recording is untrusted input: read every file as if a stranger made it".
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import replay_here, run_py

from .corpus import BAD, INCOMPLETE

RECORDING_CASES = [
    "escapes_in_meta",
    "external_link_meta",
    "external_link_passwd",
    "soft_link_group",
    "external_storage_fifo",
    "external_storage_dev_zero",
    "virtual_dataset",
    "compressed_arena",
    "fifo_path",
    "dev_zero_path",
    "fifo_sidecar",
    "health_claims_2_27_rows",
    "health_at_the_limit",
    "health_just_past_the_limit",
    "health_slots_mismatch",
    "payload_claims_a_terabyte",
    "huge_chunks",
    "nbytes_past_arena",
    "world_size_1e9",
    "array_format_version",
    "array_ring_slots",
    "array_created",
    "string_health_slots",
    "array_status_fields",
    "deep_json_meta",
    "deep_json_columns",
    "deep_manifest",
    "meta_wrong_types",
    "meta_config_disagrees",
    "meta_config_string",
    "snapshot_odd_optimizer",
    "meta_not_utf8",
    "short_status",
    "status_nonsense",
    "status_float",
    "manifest_leaf_outside_arena",
    "manifest_bad_offset_utf8",
    "manifest_mlen_past_nbytes",
    "manifest_object_dtype",
    "manifest_unhashable_key",
    "record_of_another_step",
    "marker_int64_max",
    "health_marker_negative",
    "marker_in_wrong_slot",
    "ring_dtype_float",
]
SIDECAR_CASES = [
    "sidecar_escapes",
    "sidecar_index_out_of_range",
    "sidecar_deep_verdict",
    "sidecar_external_link",
    "sidecar_bad_stack",
    "sidecar_verdict_op_index",
    "sidecar_columns_differ",
    "sidecar_largest_not_numbers",
    "sidecar_array_attr",
]
TRUNCATED = [f"truncated_{p:02d}" for p in range(0, 100, 10)]
ALL_CASES = RECORDING_CASES + SIDECAR_CASES + TRUNCATED
REPLAY_CASES = [
    "fifo_path",
    "external_link_meta",
    "short_status",
    "deep_json_meta",
    "world_size_1e9",
    "marker_int64_max",
]

MEMORY_LIMIT = 2 << 30  # address space of an info/doctor child (numpy + h5py + click, no torch)
TIMEOUT = 60  # a FIFO opened for reading blocks forever: a hang is a failure, not a wait


# One child: the address space limited first, then `replay COMMAND CASE` for every case in
# turn (the console entry point, output discarded), each under a deadline; the exit codes as JSON.
BOUNDED_CHILD = """
import contextlib, io, json, resource, signal, sys
limit, command, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from replay.cli import main
def hung(signum, frame):
    raise TimeoutError(f"hung for {timeout} s (a FIFO or device was opened?)")
signal.signal(signal.SIGALRM, hung)
codes = {}
for name, path in json.loads(sys.stdin.readline()).items():
    sink = io.StringIO()
    signal.alarm(timeout)
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            main([command, path])
        except SystemExit as e:
            codes[name] = [e.code, sink.getvalue()[-300:]]
    signal.alarm(0)
print(json.dumps(codes))
"""


def bounded_codes(command: str, cases: dict[str, str]) -> dict[str, tuple[int, str]]:
    """``replay COMMAND PATH`` for every ``{name: path}`` in one child limited to 2 GiB of
    address space: ``{name: (exit code, the end of its output)}``."""
    proc = run_py(
        "-c",
        BOUNDED_CHILD,
        str(MEMORY_LIMIT),
        command,
        str(TIMEOUT),
        env={"OPENBLAS_NUM_THREADS": "1"},
        input=json.dumps(cases) + "\n",
        timeout=TIMEOUT * 4,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        k: (c, tail) for k, (c, tail) in json.loads(proc.stdout.strip().splitlines()[-1]).items()
    }


def run_replay(*args: str) -> subprocess.CompletedProcess:
    """``replay ARGS`` in this process; bytes: every byte a terminal would receive is checked."""
    return replay_here(*args, timeout=TIMEOUT, text=False)


def assert_terminal_safe(data: bytes, what: str) -> None:
    """No byte or character a terminal acts on: C0 controls but tab and newline, DEL, C1
    controls, bidi overrides, and the output decodes as UTF-8 (no lone surrogates)."""
    raw = sorted({b for b in data if (b < 0x20 and b not in (0x09, 0x0A)) or b == 0x7F})
    assert not raw, f"{what}: control bytes {[hex(b) for b in raw]} reach the terminal"
    text = data.decode("utf-8")  # raises on invalid UTF-8
    bad = sorted({hex(ord(c)) for c in text if 0x80 <= ord(c) < 0xA0 or 0x202A <= ord(c) <= 0x202E})
    assert not bad, f"{what}: characters {bad} reach the terminal"


def check(proc: subprocess.CompletedProcess, expected: int, fragment: str, what: str) -> None:
    out = proc.stdout + proc.stderr
    assert b"Traceback" not in out, f"{what}: traceback\n{proc.stderr.decode(errors='replace')}"
    assert_terminal_safe(proc.stdout, f"{what} stdout")
    assert_terminal_safe(proc.stderr, f"{what} stderr")
    err = proc.stderr.decode()
    if expected == -1:  # a cut file: readable up to where it ends, or refused
        assert proc.returncode in (0, BAD), f"{what}: exit {proc.returncode}: {err}"
    else:
        assert proc.returncode == expected, f"{what}: exit {proc.returncode}, not {expected}: {err}"
    if proc.returncode in (BAD, INCOMPLETE):
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("replay: error: "), f"{what}: {err}"
        if fragment:
            assert fragment in lines[0], f"{what}: {fragment!r} not in {lines[0]!r}"


def test_the_case_lists_name_every_case_the_corpus_builds(corpus):
    assert sorted(corpus) == sorted(ALL_CASES)
    assert all(corpus[n].replay for n in REPLAY_CASES)


@pytest.mark.parametrize("name", ALL_CASES)
def test_info(corpus, name):
    case = corpus[name]
    proc = run_replay("info", case.path)
    check(proc, case.info, case.fragment if case.info in (BAD, INCOMPLETE) else "", f"info {name}")
    if case.info == 0 and name.startswith("escapes"):
        # what was escaped is still there, visibly
        assert b"\\x1b]0;pwned\\x07" in proc.stdout and b"\\x0a  status" in proc.stdout


@pytest.mark.parametrize("name", ALL_CASES)
def test_doctor(corpus, name):
    case = corpus[name]
    proc = run_replay("doctor", case.path)
    fragment = "" if name == "world_size_1e9" else case.fragment  # doctor reads one file
    check(proc, case.doctor, fragment if case.doctor in (BAD, INCOMPLETE) else "", f"doctor {name}")


def test_info_json_of_escapes_is_valid_json_and_safe(corpus):
    import json

    proc = run_replay("info", corpus["escapes_in_meta"].path, "--json")
    check(proc, 0, "", "info --json")
    d = json.loads(proc.stdout)
    assert "\x1b" in d["env"]["hostname"]  # JSON keeps the value exactly, escaped as \u001b


@pytest.mark.parametrize("command", ["info", "doctor"])
def test_every_case_within_bounded_memory(corpus, command):
    """A child limited to 2 GiB of address space (numpy + h5py + click, no torch) reads every
    case in turn and exits with the same documented code as ``test_info``/``test_doctor``."""
    codes = bounded_codes(command, {name: corpus[name].path for name in ALL_CASES})
    for name in ALL_CASES:
        expected, (code, tail) = getattr(corpus[name], command), codes[name]
        ok = code in (0, BAD) if expected == -1 else code == expected
        assert ok, f"{command} {name}: exit {code}, not {expected}, under the memory limit: {tail}"


@pytest.mark.parametrize("command", ["verify", "bisect", "whatif", "export"])
@pytest.mark.parametrize("name", REPLAY_CASES)
def test_replay_commands_refuse_before_replaying(corpus, name, command, tmp_path):
    """Refused on opening, before torch builds anything (no memory limit: torch needs far more
    address space than 2 GiB to import)."""
    case = corpus[name]
    extra = {  # whatif needs a change to try; export a folder to write into (left empty)
        "whatif": ("--seed", "1"),
        "export": ("--out", str(tmp_path / "out")),
    }.get(command, ())
    proc = run_replay(command, case.path, *extra)
    check(proc, INCOMPLETE if case.info == INCOMPLETE else BAD, case.fragment, command)
    assert not (tmp_path / "out").exists()  # nothing written for a file refused
