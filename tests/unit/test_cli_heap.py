"""The console process's heap: no collections while torch is imported, frozen after.

Measured on the bisect benchmark: full collections over torch's heap cost 0.6 s during a bisect
and ~1 s at exit, of a 5.7 s run. A test process (CliRunner) must be left alone.
"""

import gc
import subprocess
import sys

from replay.cli import _process


def test_a_process_that_is_not_ours_keeps_its_collector():
    frozen = gc.get_freeze_count()
    with _process.big_imports():
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_the_console_process_collects_nothing_while_importing_then_freezes():
    code = (
        "import gc; from replay.cli import _process as p; p.own_process()\n"
        "with p.big_imports():\n"
        "    assert not gc.isenabled()\n"
        "    with p.big_imports(): assert not gc.isenabled()  # nested: the outer one decides\n"
        "    import json, email.parser\n"
        "assert gc.isenabled() and gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
