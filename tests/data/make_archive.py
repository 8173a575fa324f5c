"""Write the archived recording of the current format version into tests/data/.

    .venv/bin/python tests/data/make_archive.py

Run once per released format version and commit the file: tests/unit/test_format_archive.py
reads every archived recording back, so a format change can never silently break old files.
The run is tests/integration/scripts/mlp_train.py: its batches are a pure function of the step
(``make_batch``), so the test can check the contents without trusting the recorder.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from replay.store.layout import FORMAT_VERSION  # noqa: E402

out = os.path.join(HERE, f"recording_v{FORMAT_VERSION}.h5")
if os.path.exists(out):
    os.remove(out)
script = os.path.join(ROOT, "tests", "integration", "scripts", "mlp_train.py")
args = ["--steps", "12", "--snapshot-every", "4", "--keep", "2", "--keep-health", "64", "--vary"]
env = dict(os.environ, PYTHONPATH=ROOT, REPLAY_SELF_CHECK="0")  # (its snapshot and sidecar)
subprocess.check_call([sys.executable, script, out, *args], env=env, stdout=subprocess.DEVNULL)
print(f"wrote {out} ({os.path.getsize(out)} bytes)")
