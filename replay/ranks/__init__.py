"""Ranks: what a rank set is and how each rank records (one home; docs/architecture.md).

The reading side is numpy + h5py only, like the store (``replay info`` and the TUI use it
without torch): ``names`` (a rank's file name, a rank set's files: no h5py, the one part the
recorder imports), ``files`` (a rank set's recordings opened), ``first_bad`` (the first bad
(step, rank) and why), ``scan`` (the one resolver every command asks: each rank file read once,
a missing or damaged one refused), ``summary`` (the one summary of a scanned set that ``replay
info``, ``doctor``, the TUI and the report page show). The recording side is torch: ``context`` (is this process a
rank?), ``policy`` (what the recorder does about the other ranks), ``votes`` (the ranks' agreed
stop) and ``ddp_hook`` (the communication hook that measures a rank's own gradients and carries
the votes). Replaying ranks, together or one alone, is ``replay.multirank``'s.

Nothing is imported here: importing ``replay.ranks.names`` must not load the reader.
"""
