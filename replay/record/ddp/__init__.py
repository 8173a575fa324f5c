"""The recorder's DDP side: detecting the process group, the communication hook that measures
each rank's own gradient norm before the all-reduce and carries the ranks' stop votes in DDP's own
last all-reduce of the step, and the stop that makes every rank raise at the same step. Reading
and bisecting rank sets is ``replay.distributed``'s business."""
