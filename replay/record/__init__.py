"""Recording: capture on the training thread, encode and write on a background thread.

Nothing is imported here: ``replay.capture.guard`` (read by ``replay preflight``) must not import
torch, and ``replay.Recorder`` is ``replay.record.recorder.Recorder``."""
