"""The recorder's DDP side: detecting the process group, the communication hook that measures
each rank's own gradient norm before the all-reduce, and the one-vote stop that makes every rank
raise at the same step. Reading and bisecting rank sets is ``replay.distributed``'s business."""
