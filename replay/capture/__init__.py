"""What recording and replay both compute, from one copy of the code: capturing tensors and RNG
states, the run contract (named objects, the step call, per-step values, what a snapshot holds),
the gradient norm before any clip, the parameter fingerprint. The recorder takes a step's numbers
with these functions and the replay engine recomputes them with the same ones, so a replayed
value and a recorded one compare bitwise.

``guard`` holds the two process modes a Recorder must respect (replay importing user code,
``replay preflight``); it imports no torch.
"""
