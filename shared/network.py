"""The Q-network, built by one factory that collectors and learner both call.

Image observations (uint8 [B, S, H, W]) go through the Nature-DQN CNN; the uint8 -> float
scaling happens inside the network so uint8 is what travels, is stored and is gathered.
Vector observations ([B, S, D], any float dtype) go through an MLP. Both end in a dueling
head (or a plain linear head). He (Kaiming) init for ReLU layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from shared.env_spec import is_image_obs  # the torso rule: 2-D frames take the CNN (EnvSpec.image)


class DuelingHead(nn.Module):
    """Q = V + A - mean(A): separates state value from action advantages."""

    def __init__(self, in_features: int, hidden: int, num_actions: int, dueling: bool) -> None:
        super().__init__()
        self.dueling = dueling
        self.advantage = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_actions))
        self.value = (
            nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 1)) if dueling else None
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(features)
        if self.value is None:
            return adv
        return self.value(features) + adv - adv.mean(dim=1, keepdim=True)


class NatureCNN(nn.Module):
    """Mnih et al. 2015 torso for stacked uint8 frames."""

    def __init__(self, stack: int, frame_hw: tuple[int, int]) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(stack, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.out_features = int(self.convs(torch.zeros(1, stack, *frame_hw)).shape[1])

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        # scale inside the network: uint8 is what travels, is stored and is gathered
        return self.convs(frames.float().div_(255.0) if frames.dtype == torch.uint8 else frames)


class VectorMLP(nn.Module):
    """Two hidden layers for low-dimensional observations such as CartPole."""

    def __init__(self, in_features: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU())
        self.out_features = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.layers(obs.float())


class QNetwork(nn.Module):
    def __init__(self, torso: nn.Module, head: DuelingHead) -> None:
        super().__init__()
        self.torso = torso
        self.head = head

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs))


def build_q_network(
    obs_shape: Sequence[int],
    stack: int,
    num_actions: int,
    hidden: int = 512,
    dueling: bool = True,
) -> QNetwork:
    """One factory for collectors and learner: same architecture, same init, same inputs.

    `obs_shape` is one observation's shape ((H, W) for frames, (D,) for vectors); the network
    input is [B, stack, *obs_shape].
    """
    if num_actions < 1:
        raise ValueError(f"num_actions={num_actions}: need at least one action")
    if is_image_obs(obs_shape):
        torso: nn.Module = NatureCNN(stack, (int(obs_shape[0]), int(obs_shape[1])))
    else:
        flat = stack
        for dim in obs_shape:
            flat *= int(dim)
        torso = VectorMLP(flat, hidden)
    net = QNetwork(torso, DuelingHead(torso.out_features, hidden, num_actions, dueling))
    _he_init(net)
    return net


def _he_init(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
