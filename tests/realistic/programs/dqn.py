"""dqn-shaped (PyTorch's reinforcement_q_learning tutorial): a Q-network plays a small cart-pole
written in numpy with an epsilon-greedy policy, keeps every transition in a replay memory (a
``deque``) and, after each move, learns from a minibatch sampled from that memory with a Huber
loss against a target network it soft-updates.

The planted bug: the observation kept for move ``--nan-at`` holds a NaN (a sensor glitch). The transition goes into the memory like any other; the first minibatch that samples
it makes the Q-values, the loss and then the weights NaN.

``--shape batch`` (the default): the loop samples the minibatch and hands it to the step
(``rec.step(transitions)``), so the step depends on nothing but the objects and its batch.
``--shape memory``: as the tutorial writes it, ``optimize_model()`` samples from the global
memory itself (``rec.step(t)``); the memory, filled by the loop between steps, is state no
snapshot holds, so a replay from a snapshot cannot sample what the run sampled (it raises: the
replayed memory is empty). ``--shape tutorial``: the same step, called after every move as the
tutorial calls it, returns at once while the memory is short: the first steps are no-ops that
replay, and later ones differ.

    python dqn.py run.h5 [--moves 120] [--nan-at 70] [--shape batch|memory|tutorial]
"""

import argparse
import math
import random
import sys
from collections import deque, namedtuple

import numpy as np
import torch
import torch.nn as nn

import replay

BATCH_SIZE, GAMMA, TAU, LR = 16, 0.99, 0.005, 1e-3
Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


class ReplayMemory:
    def __init__(self, capacity):
        self.memory = deque([], maxlen=capacity)

    def push(self, *args):
        self.memory.append(Transition(*args))

    def sample(self, batch_size):
        return random.sample(self.memory, batch_size)

    def __len__(self):
        return len(self.memory)


class CartPole:
    """gymnasium's CartPole-v1 dynamics, in numpy: state x, x', theta, theta'."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(4)

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
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


class DQN(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(4, 64)
        self.layer2 = nn.Linear(64, 64)
        self.layer3 = nn.Linear(64, 2)

    def forward(self, x):
        x = torch.relu(self.layer1(x))
        x = torch.relu(self.layer2(x))
        return self.layer3(x)


policy_net, target_net = DQN(), DQN()
optimizer = torch.optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(10000)


def learn(transitions):
    """One DQN update from a minibatch of transitions (the tutorial's ``optimize_model``)."""
    batch = Transition(*zip(*transitions))
    non_final_mask = torch.tensor([s is not None for s in batch.next_state], dtype=torch.bool)
    non_final_next = torch.cat([s for s in batch.next_state if s is not None])
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(len(transitions))
    with torch.no_grad():
        next_state_values[non_final_mask] = target_net(non_final_next).max(1).values
    expected = (next_state_values * GAMMA) + reward_batch
    loss = nn.SmoothL1Loss()(state_action_values, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    target_sd, policy_sd = target_net.state_dict(), policy_net.state_dict()
    for key in policy_sd:
        target_sd[key] = policy_sd[key] * TAU + target_sd[key] * (1 - TAU)
    target_net.load_state_dict(target_sd)
    return loss


def optimize_model(t):
    """The tutorial's shape: the step samples the global memory itself."""
    return learn(memory.sample(BATCH_SIZE))


def optimize_model_when_full(t):
    """As the tutorial writes it: returns at once while the memory holds less than a
    minibatch, samples it after."""
    if len(memory) < BATCH_SIZE:
        return None
    return learn(memory.sample(BATCH_SIZE))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--moves", type=int, default=120)
    p.add_argument("--nan-at", type=int, default=70)
    p.add_argument("--shape", choices=["batch", "memory", "tutorial"], default="batch")
    args = p.parse_args()

    random.seed(0)
    torch.manual_seed(0)
    target_net.load_state_dict(policy_net.state_dict())
    env = CartPole(0)
    state = torch.tensor(env.reset()).unsqueeze(0)
    step_fn = {"batch": learn, "memory": optimize_model, "tutorial": optimize_model_when_full}[
        args.shape
    ]
    with replay.Recorder(
        args.out,
        objects={"model": policy_net, "target_net": target_net, "optimizer": optimizer},
        step_fn=step_fn,
        snapshot_every=20,
    ) as rec:
        for move in range(args.moves):
            eps = 0.05 + 0.85 * math.exp(-move / 100)
            if random.random() > eps:
                with torch.no_grad():
                    action = policy_net(state).max(1).indices.view(1, 1)
            else:
                action = torch.tensor([[random.randrange(2)]])
            if move == args.nan_at:
                state = state.clone()
                state[0, 1] = float("nan")  # the sensor glitch, in the transition kept
            obs, reward, done = env.step(action.item())
            next_state = None if done else torch.tensor(obs).unsqueeze(0)
            memory.push(state, action, next_state, torch.tensor([reward]))
            state = torch.tensor(env.reset()).unsqueeze(0) if done else next_state
            if args.shape == "tutorial":  # a step every move, as the tutorial optimizes
                loss = rec.step(move)
                continue
            if len(memory) < BATCH_SIZE:
                continue
            if args.shape == "batch":
                loss = rec.step(memory.sample(BATCH_SIZE))
            else:
                loss = rec.step(move)
            print(f"move {move} loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)
