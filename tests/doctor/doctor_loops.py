"""Tiny real training loops for the doctor rules no example covers (module-level entry points,
as the Recorder requires). ``VARIANT`` picks the bug; ``record(path, variant)`` runs it."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

VARIANT = "plain"
LR = {
    "plain": 3e-3,
    "tiny_lr": 1e-9,
    "tiny_grad": 3e-3,
    "no_step": 3e-3,
    "saturated": 3e-3,
    "amp_collapse": 3e-3,
    "eval_mode": 3e-3,
    "clipped_explosion": 20.0,
    "rnn_state": 1e-3,
    "decaying_lr": 1e6,  # set by the loop, 0.9x every step: far too high all along
    "grouped_lr": 1e6,  # the first layer's group only, set like decaying_lr; the rest 1e-3
    "ragged_inputs": 3e-3,
    "died_in_loader": 3e-3,  # plain, until its loader raises between two steps
}
CLIP = 1.0


class CarriedRNN(nn.Module):
    """A ReLU RNN whose hidden state the loop feeds back with the next batch. Its recurrence is
    the identity and its input bias positive, so the state grows step after step: a model
    output, not data, whatever its scale."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(8, 16, nonlinearity="relu")
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            self.rnn.weight_hh_l0.copy_(torch.eye(16))
            self.rnn.weight_ih_l0.mul_(0.1)
            self.rnn.bias_ih_l0.fill_(0.1)
            self.rnn.bias_hh_l0.zero_()

    def forward(self, x, h):
        out, h = self.rnn(x, h)
        return self.head(out[-1]), h


def build():
    torch.manual_seed(0)
    act = nn.Tanh() if VARIANT == "saturated" else nn.ReLU()
    if VARIANT == "rnn_state":
        model = CarriedRNN()
    elif VARIANT == "clipped_explosion":  # linear: nothing saturates or dies as weights grow
        model = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 4))
    elif VARIANT == "eval_mode":
        model = nn.Sequential(nn.Linear(8, 32), act, nn.Dropout(0.5), nn.Linear(32, 4))
    else:
        model = nn.Sequential(nn.Linear(8, 32), act, nn.Linear(32, 4))
    if VARIANT == "clipped_explosion":
        return model, torch.optim.SGD(model.parameters(), lr=LR[VARIANT])
    if VARIANT == "grouped_lr":
        first, rest = list(model[0].parameters()), list(model[2].parameters())
        return model, torch.optim.Adam(
            [{"params": first}, {"params": rest, "lr": 1e-3}], LR[VARIANT]
        )
    opt = torch.optim.Adam(model.parameters(), lr=LR[VARIANT])
    if VARIANT == "amp_collapse":
        return model, opt, None, torch.amp.GradScaler("cpu", init_scale=2.0**16)
    return model, opt


SCALER = None


def train_step(model, optimizer, batch):
    x, y = batch[:2]
    optimizer.zero_grad(set_to_none=True)
    if VARIANT == "amp_collapse":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        # a loss path that is inf in any precision: the scaler can never find a good scale
        SCALER.scale(loss * torch.tensor(float("inf"))).backward()
        SCALER.step(optimizer)
        SCALER.update()
        return loss.detach()
    if VARIANT == "rnn_state":
        x, y, h = batch
        logits, h = model(x, h)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        return loss, h.detach()
    if VARIANT == "clipped_explosion":  # a regression loss: its gradient grows with the error
        loss = F.mse_loss(model(x), F.one_hot(y, 4).float())
    else:
        loss = F.cross_entropy(model(x), y)
    (loss * 1e-12 if VARIANT == "tiny_grad" else loss).backward()
    if VARIANT == "clipped_explosion":
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    if VARIANT != "no_step":
        optimizer.step()
    return loss


def record(path: str, variant: str, steps: int = 40) -> str:
    global VARIANT, SCALER
    VARIANT = variant
    objs = build()
    model, opt = objs[0], objs[1]
    SCALER = objs[3] if len(objs) > 3 else None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps * 16, 8, generator=g)
    y = (x[:, :4]).argmax(1)
    if variant == "saturated":
        x = x * 100.0  # raw-scale inputs: every tanh pinned at +-1
    if variant == "eval_mode":
        model.eval()  # forgotten model.train(): Dropout off for the whole run
    try:
        _train(path, variant, steps, model, opt, x, y, g)
    except ValueError as e:  # died_in_loader: the recording keeps it, as the program dies of it
        assert variant == "died_in_loader", e
    return path


def _train(path, variant, steps, model, opt, x, y, g) -> None:
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        scaler=SCALER,
        snapshot_every=10,
        keep_snapshots=steps // 10,
        raise_on_nonfinite=False,
    ) as rec:
        h = torch.zeros(1, 16, 16)
        for s in range(steps):
            if variant == "died_in_loader" and s == steps // 2:
                raise ValueError(f"corrupt sample {s * 16 + 3}")  # between steps
            if variant == "decaying_lr":
                for group in opt.param_groups:
                    group["lr"] = LR[variant] * 0.9**s
            if variant == "grouped_lr":
                opt.param_groups[0]["lr"] = LR[variant] * 0.9**s
            xs, ys = x[s * 16 : (s + 1) * 16], y[s * 16 : (s + 1) * 16]
            if variant == "rnn_state":
                _, h = rec.step((xs.reshape(4, 4, 8).repeat(1, 4, 1), ys[:16], h))
            elif variant == "ragged_inputs":  # a float leaf whose width changes every step
                rec.step((xs, ys, torch.randn(16, 2 + s % 3, generator=g)))
            else:
                rec.step((xs, ys))
