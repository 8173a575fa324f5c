"""Replaying every rank of a DDP or FSDP2 rank set together, as the run was.

``launch.replay_rank_set`` starts one process per rank (``replay.workflows.rank_worker``, with
the environment torchrun gives), each with its own engine on its own rank file in a process group of the recorded world
size; ``lockstep`` makes the leader's engine calls on every rank, so that each collective finds
its peers. Reading a rank set (which rank failed first) is ``replay.distributed``'s.
"""
