"""Replaying the ranks of a DDP or FSDP2 rank set: every rank together, as the run was, or one
alone.

``choice`` decides which from ``RUN``, ``--rank`` and ``--alone``. ``launch.replay_rank_set``
starts one process per rank (``replay.workflows.rank_worker``, with the environment torchrun
gives), each with its own engine on its own rank file in a process group of the recorded world
size; ``lockstep`` makes the leader's engine calls on every rank, so that each collective finds
its peers. ``alone`` shows the bisector one rank replayed without its peers. What a rank set is
(its files, which rank failed first) is ``replay.ranks``'s.
"""
