"""reinforce-shaped (pytorch/examples reinforcement_learning): a policy network plays episodes of
a small cart-pole written in numpy, samples its actions from ``Categorical`` and learns with
REINFORCE. There is no batch from a loader: each training step plays one whole episode (the
rollout builds the autograd graph the update needs) and then updates, so the Recorder gets the
episode's seed as the step's batch.

The classic bug: the returns are normalised with ``(returns - returns.mean()) / (returns.std()
+ eps)``, and an episode that ends after one move has a single return, whose ``std`` (with
Bessel's correction) is NaN. Episode ``--short-at`` starts the pole past its limit, so it ends
at once: the loss of that step is NaN, made by ``aten::std``.

``--env-rng global``: the environment draws its start state from its own numpy ``Generator``
seeded once, as gymnasium's ``env.reset(seed=...)`` does at the start of a run; the step then
depends on state outside anything the Recorder holds (the generator), and the recording cannot
replay. ``--env-rng step`` (the default) reseeds it from the step's seed.

    python reinforce.py run.h5 [--episodes 30] [--short-at 17] [--env-rng step|global]
"""

import argparse
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

import replay

GAMMA, EPS = 0.99, float(np.finfo(np.float32).eps)


class CartPole:
    """gymnasium's CartPole-v1 dynamics, in numpy (no dependency): state x, x', theta, theta'."""

    def __init__(self, seed):
        self.np_random = np.random.default_rng(seed)
        self.state = np.zeros(4)

    def reset(self, seed=None, tilt=0.0):
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.state = self.np_random.uniform(-0.05, 0.05, size=4)
        self.state[2] += tilt
        return self.state.astype(np.float32)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.state = np.array([x, x_dot, theta, theta_dot])
        done = abs(x) > 2.4 or abs(theta) > 12 * 2 * math.pi / 360
        return self.state.astype(np.float32), 1.0, done


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 64)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(64, 2)

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--short-at", type=int, default=17)
    p.add_argument("--env-rng", choices=["step", "global"], default="step")
    args = p.parse_args()

    torch.manual_seed(543)
    env = CartPole(543)
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def episode(seed):
        """One episode played and learned from: the rollout, then the REINFORCE update."""
        tilt = 0.5 if seed == args.short_at else 0.0  # past the limit: over after one move
        state = env.reset(seed=seed if args.env_rng == "step" else None, tilt=tilt)
        log_probs, rewards = [], []
        for _ in range(200):
            probs = policy(torch.from_numpy(state).unsqueeze(0))
            m = Categorical(probs)
            action = m.sample()
            log_probs.append(m.log_prob(action))
            state, reward, done = env.step(action.item())
            rewards.append(reward)
            if done:
                break
        ret, returns = 0.0, []
        for r in reversed(rewards):
            ret = r + GAMMA * ret
            returns.insert(0, ret)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + EPS)
        loss = torch.cat([-lp * r for lp, r in zip(log_probs, returns)]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(
        args.out,
        objects={"model": policy, "optimizer": optimizer},
        step_fn=episode,
        snapshot_every=10,
    ) as rec:
        for i in range(args.episodes):
            loss = rec.step(i)
            print(f"episode {i} loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)
