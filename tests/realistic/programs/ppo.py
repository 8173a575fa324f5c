"""ppo-shaped (CleanRL's ``ppo.py``): an actor-critic plays a vectorised toy environment (in
torch, no gym), and after each rollout learns from it with clipped PPO: the advantages by GAE,
then ``--update-epochs`` passes over the rollout in shuffled minibatches.
The rollout happens outside the step; each minibatch update is one ``rec.step``.

The planted bug is one people write: the policy's entropy computed by hand as
``-(p * p.log()).sum(-1)``. With ``--lr 0.3`` the logits grow until a probability underflows
to 0; ``aten::log`` makes -inf from it and ``aten::mul`` (0 * -inf) turns it into NaN, which
reaches the loss through the entropy bonus, the gradients and the weights; the next rollout's
``Categorical`` then refuses the NaN probabilities (exit 3). As in CleanRL, the update returns
nothing: the gradients are the first place the NaN is seen.

    python ppo.py run.h5 [--lr 0.3] [--iterations 4] [--seed 1]
"""

import argparse
import sys

import numpy as np
import torch
import torch.nn as nn

import replay


class PointVec:
    """``num_envs`` points pushed left or right towards a target on a line, stepped together
    and reset where they end, as a vector env's autoreset does. Observation: position,
    velocity, target, time left."""

    def __init__(self, num_envs, seed, horizon=24):
        self.n, self.horizon = num_envs, horizon
        self.g = torch.Generator().manual_seed(seed)
        self.state = torch.zeros(num_envs, 4)

    def _fresh(self, k):
        s = torch.zeros(k, 4)
        s[:, 0] = torch.rand(k, generator=self.g) * 2 - 1
        s[:, 2] = torch.rand(k, generator=self.g) * 2 - 1
        s[:, 3] = 1.0
        return s

    def reset(self):
        self.state = self._fresh(self.n)
        return self.state.clone()

    def step(self, action):
        s = self.state.clone()
        s[:, 1] = 0.8 * s[:, 1] + torch.where(action == 1, 0.05, -0.05)
        s[:, 0] = s[:, 0] + s[:, 1]
        s[:, 3] = s[:, 3] - 1.0 / self.horizon
        reward = -(s[:, 0] - s[:, 2]).abs()
        done = (s[:, 3] <= 0) | ((s[:, 0] - s[:, 2]).abs() < 0.05)
        if done.any():
            s[done] = self._fresh(int(done.sum()))
        self.state = s
        return s.clone(), reward, done.float()


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(4, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(4, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 2), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        p = torch.softmax(logits, dim=-1)
        probs = torch.distributions.Categorical(probs=p)
        if action is None:
            action = probs.sample()
        entropy = -(p * p.log()).sum(-1)  # the bug: 0 * log(0) is NaN
        return action, probs.log_prob(action), entropy, self.critic(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=32)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--num-minibatches", type=int, default=4)
    args = p.parse_args()
    gamma, gae_lambda, clip_coef, ent_coef, vf_coef, max_grad_norm = 0.99, 0.95, 0.2, 0.01, 0.5, 0.5
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    envs = PointVec(args.num_envs, args.seed)
    agent = Agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    def update(mb):
        """One minibatch update of clipped PPO (CleanRL's inner loop body)."""
        obs, actions, logprobs, advantages, returns, values = mb
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions.long())
        ratio = (newlogprob - logprobs).exp()
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()
        newvalue = newvalue.view(-1)
        v_clipped = values + torch.clamp(newvalue - values, -clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
        loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
        optimizer.step()

    obs = torch.zeros(args.num_steps, args.num_envs, 4)
    actions = torch.zeros(args.num_steps, args.num_envs)
    logprobs = torch.zeros(args.num_steps, args.num_envs)
    rewards = torch.zeros(args.num_steps, args.num_envs)
    dones = torch.zeros(args.num_steps, args.num_envs)
    values = torch.zeros(args.num_steps, args.num_envs)
    next_obs, next_done = envs.reset(), torch.zeros(args.num_envs)

    with replay.Recorder(
        args.out, objects={"model": agent, "optimizer": optimizer}, step_fn=update, snapshot_every=8
    ) as rec:
        for iteration in range(1, args.iterations + 1):
            for step in range(args.num_steps):  # the rollout: outside the step
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
                next_obs, rewards[step], next_done = envs.step(action)
            with torch.no_grad():  # GAE
                next_value = agent.get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal, nextvalues = 1.0 - next_done, next_value
                    else:
                        nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                    delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
                    lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
                    advantages[t] = lastgaelam
                returns = advantages + values
            b = (
                obs.reshape(-1, 4),
                actions.reshape(-1),
                logprobs.reshape(-1),
                advantages.reshape(-1),
                returns.reshape(-1),
                values.reshape(-1),
            )
            b_inds = np.arange(batch_size)
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, batch_size, minibatch_size):
                    mb_inds = torch.from_numpy(b_inds[start : start + minibatch_size])
                    rec.step(tuple(x[mb_inds] for x in b))
            print(f"iteration {iteration} return {float(rewards.sum()):.2f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # Categorical(probs=nan)
        print(str(e).splitlines()[0], file=sys.stderr)
        sys.exit(3)
