"""A DQN training loop on CartPole, profiled with profkit: sampled windows with a warm-up.

Run: ``python examples/training_loop.py`` (needs gymnasium: ``pip install 'profkit[examples]'``).

Each step is a root region ``train_step`` with ``env``, ``forward``, ``loss``, ``backward``
and ``optimizer`` regions inside. One step in 100 opens a profiler window that runs one
warm-up step (profiled, discarded: it absorbs the profiler's start-up noise) and then records
two steps, which the console exporter prints on stderr.
"""

from __future__ import annotations

import argparse
import collections
import copy
import random
import sys

import torch
import torch.nn.functional as F

import profkit

try:
    import gymnasium as gym
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("this example needs gymnasium: pip install 'profkit[examples]'")

BATCH = 64
GAMMA = 0.99
TARGET_SYNC = 50


def build_q_net() -> torch.nn.Module:
    """Q-values for CartPole's 2 actions from its 4 observations."""
    return torch.nn.Sequential(
        torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 2),
    )  # fmt: skip


class Replay:
    """A bounded replay buffer of (state, action, reward, next_state, done) transitions."""

    def __init__(self, capacity: int, rng: random.Random) -> None:
        self.items: collections.deque[tuple[list[float], int, float, list[float], float]]
        self.items = collections.deque(maxlen=capacity)
        self.rng = rng

    def push(
        self, state: list[float], action: int, reward: float, nxt: list[float], done: bool
    ) -> None:
        self.items.append((state, action, reward, nxt, float(done)))

    def sample(self, n: int) -> tuple[torch.Tensor, ...]:
        states, actions, rewards, nexts, dones = zip(*self.rng.sample(self.items, n), strict=True)
        return (
            torch.tensor(states, dtype=torch.float32),
            torch.tensor(actions, dtype=torch.int64),
            torch.tensor(rewards, dtype=torch.float32),
            torch.tensor(nexts, dtype=torch.float32),
            torch.tensor(dones, dtype=torch.float32),
        )


def train(steps: int, seed: int) -> list[float]:
    """Run ``steps`` training steps; returns the finished episodes' returns."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # ops this small only lose time to intra-op thread hand-offs
    env = gym.make("CartPole-v1")
    q_net = build_q_net()
    target = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3)
    replay = Replay(10_000, rng)
    returns: list[float] = []
    episode_return = 0.0
    state, _ = env.reset(seed=seed)

    def env_step(action: int) -> None:
        nonlocal state, episode_return
        nxt, reward, terminated, truncated, _ = env.step(action)
        replay.push(state.tolist(), action, float(reward), nxt.tolist(), terminated)
        episode_return += float(reward)
        state = nxt
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            state, _ = env.reset()

    for _ in range(2 * BATCH):  # fill the buffer with random play first (not profiled)
        env_step(rng.randrange(2))

    for step in range(steps):
        with profkit.region("train_step", step=step):
            with profkit.region("env"):
                epsilon = max(0.05, 1.0 - step / (0.6 * steps))
                if rng.random() < epsilon:
                    action = rng.randrange(2)
                else:
                    with torch.no_grad():
                        action = int(q_net(torch.as_tensor(state)).argmax())
                env_step(action)
            states, actions, rewards, nexts, dones = replay.sample(BATCH)
            with profkit.region("forward"):
                q = q_net(states).gather(1, actions.unsqueeze(1)).squeeze(1)
                with torch.no_grad():
                    best_next = target(nexts).max(dim=1).values
                    wanted = rewards + GAMMA * best_next * (1.0 - dones)
            with profkit.region("loss"):
                loss = F.smooth_l1_loss(q, wanted)
            with profkit.region("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with profkit.region("optimizer"):
                optimizer.step()
        if step % TARGET_SYNC == 0:
            target.load_state_dict(q_net.state_dict())
    env.close()
    return returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="DQN on CartPole, profiled with profkit.")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    profkit.configure(sample_every=100, window=2, warmup=1, exporters=("console",))
    returns = train(args.steps, args.seed)
    profkit.force_flush()
    stats = profkit.stats()
    profkit.shutdown()
    last = returns[-10:] or [0.0]
    mean = sum(last) / len(last)
    print(f"{args.steps} steps, {len(returns)} episodes, last {len(last)} returned {mean:.1f}")
    print(
        f"profkit: root_calls={stats['root_calls']} windows={stats['windows']} "
        f"warmup_calls={stats['warmup_calls']} sampled={stats['sampled']} "
        f"exported={stats['exported']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
