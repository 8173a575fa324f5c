"""One rank of a 2-rank run, without DDP: ``python rank_fixture.py RANK OUT.h5 [mlp_train args]``.

Runs the real ``tests/integration/scripts/mlp_train.py`` with its ``replay.Recorder`` given
``rank=RANK, world_size=2`` (the launcher override: no process group), so it writes
``OUT.rankRANK.h5`` with ``meta.distributed`` as a DDP rank would. A NaN loss ends the run
quietly, as the agreed stop ends every rank of a real DDP run.
"""

import functools
import os
import runpy
import sys

import torch

import replay

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "integration", "scripts", "mlp_train.py")

if __name__ == "__main__":
    torch.set_num_threads(1)  # the same bits on every machine: the snapshot shows the losses
    rank, out, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    replay.Recorder = functools.partial(replay.Recorder, rank=rank, world_size=2)
    sys.argv = [SCRIPT, out, *rest]
    try:
        runpy.run_path(SCRIPT, run_name="__main__")
    except replay.NonFiniteLossError:
        pass
    except SystemExit as e:
        sys.exit(e.code)
