"""The Q-network, built by one factory that collectors and learner both call.

Image observations (uint8 [B, S, H, W]) go through a CNN encoder chosen by `learner.encoder`:
the Nature-DQN CNN (default) or the IMPALA residual CNN; the uint8 -> float scaling happens
inside the network so uint8 is what travels, is stored and is gathered. Vector observations
([B, S, D], any float dtype) go through an MLP. All end in a dueling head (or a plain linear
head), with one value per action or, for QR-DQN, N quantiles per action. He (Kaiming) init for ReLU
layers. With `noisy_sigma` > 0 the head's linear layers are NoisyNet layers (factorized Gaussian noise,
Fortunato et al. 2018): exploration by perturbed weights the learner tunes, resampled by whoever acts or
learns (`reset_noise`), switched off for evaluation (`set_noise(False)`: the mean weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from envs.spec import EnvSpec, is_image_obs  # the torso rule: 2-D frames take the CNN (EnvSpec.image)
from shared.config import ENCODERS, LearnerConfig

NOISY_SIGMA0 = 0.5  # the NoisyNet paper's factorized sigma0: what rebuilding a checkpoint's network for loading uses


class _NoisyWeight(torch.autograd.Function):
    """mu + sigma * outer in one pass, whose backward is one product: d mu = g, d sigma = g * outer (autograd's own
    addcmul backward also multiplies `outer` by its scalar factor, a third pass over the out x in weight)."""

    @staticmethod
    def forward(mu: torch.Tensor, sigma: torch.Tensor, outer: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(mu, sigma, outer)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[2])  # a separate setup_context: what torch.func's transforms (the device step) need

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        (outer,) = ctx.saved_tensors
        return (grad if ctx.needs_input_grad[0] else None, grad * outer if ctx.needs_input_grad[1] else None, None)


class NoisyLinear(nn.Module):
    """y = (mu_w + sigma_w * eps_w) x + mu_b + sigma_b * eps_b, with factorized noise eps_w = f(eps_out) f(eps_in)^T,
    eps_b = f(eps_out), f(x) = sign(x) sqrt(|x|) (Fortunato et al. 2018, the factorized form DQN variants use).

    mu ~ U(-1/sqrt(in), 1/sqrt(in)) and sigma = sigma0 / sqrt(in) at init. The noise is a pair of vectors kept
    outside the state_dict (what travels, is checkpointed and loaded are mu and sigma only): `reset_noise` draws a
    new pair, `noise = False` makes the layer its mean (a plain linear layer with weights mu)."""

    def __init__(self, in_features: int, out_features: int, sigma0: float) -> None:
        super().__init__()
        if sigma0 <= 0:
            raise ValueError(f"sigma0={sigma0}: a NoisyLinear needs sigma0 > 0")
        self.in_features, self.out_features = in_features, out_features
        bound = in_features ** -0.5
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        self.register_buffer("eps_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features), persistent=False)
        self.noise = True
        self.reset_noise()

    @staticmethod
    def _scaled_noise(n: int, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        x = torch.randn(n, generator=generator, device=like.device, dtype=like.dtype)
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        if self.eps_in.is_meta:
            return
        self.eps_in.copy_(self._scaled_noise(self.in_features, self.eps_in, generator))
        self.eps_out.copy_(self._scaled_noise(self.out_features, self.eps_out, generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.noise:
            return nn.functional.linear(x, self.weight_mu, self.bias_mu)
        bias = self.bias_mu + self.bias_sigma * self.eps_out
        if torch.is_grad_enabled() and (self.weight_mu.requires_grad or self.weight_sigma.requires_grad):
            # Learning: the noisy weight in one pass, its backward one product (_NoisyWeight).
            weight = _NoisyWeight.apply(self.weight_mu, self.weight_sigma, torch.outer(self.eps_out, self.eps_in))
            return nn.functional.linear(x, weight, bias)
        # Acting and targets: never form the out x in weight. (sigma * eps_out eps_in^T) x is
        # eps_out * (sigma (eps_in * x)): a second matrix product reading sigma once, which at a collector's
        # batch of a few stacks costs a fraction of building the weight.
        return nn.functional.linear(x, self.weight_mu, bias) + self.eps_out * nn.functional.linear(x * self.eps_in,
                                                                                                    self.weight_sigma)


class DuelingHead(nn.Module):
    """Q = V + A - mean(A): separates state value from action advantages.

    With `quantiles` N > 0 (QR-DQN) every action gets N quantiles of its return: the advantage layer
    outputs A x N values, the value layer N, combined per quantile; `forward` returns their mean over the
    quantiles (the Q-values acting and evaluation use), `forward(..., quantiles=True)` the [B, A, N] quantiles
    the loss needs. With `noisy_sigma` > 0 its linear layers are NoisyLinear layers of that sigma0."""

    def __init__(self, in_features: int, hidden: int, num_actions: int, dueling: bool, quantiles: int = 0,
                 noisy_sigma: float = 0.0) -> None:
        super().__init__()
        if quantiles < 0:
            raise ValueError(f"quantiles={quantiles}: need 0 (off) or more")
        if noisy_sigma < 0:
            raise ValueError(f"noisy_sigma={noisy_sigma}: need 0 (off) or more")
        self.dueling, self.num_actions, self.quantiles = dueling, num_actions, quantiles
        per_action = max(1, quantiles)

        def linear(n_in: int, n_out: int) -> nn.Module:
            return NoisyLinear(n_in, n_out, noisy_sigma) if noisy_sigma > 0 else nn.Linear(n_in, n_out)

        self.advantage = nn.Sequential(linear(in_features, hidden), nn.ReLU(), linear(hidden, num_actions * per_action))
        self.value = (
            nn.Sequential(linear(in_features, hidden), nn.ReLU(), linear(hidden, per_action)) if dueling else None
        )

    def forward(self, features: torch.Tensor, quantiles: bool = False) -> torch.Tensor:
        if quantiles and not self.quantiles:
            raise ValueError("quantiles=True: this head has one value per action (learner.quantiles=0)")
        adv = self.advantage(features)
        if self.quantiles:
            adv = adv.view(adv.shape[0], self.num_actions, self.quantiles)
        if self.value is None:
            q = adv
        else:
            value = self.value(features)
            if self.quantiles:
                value = value.view(value.shape[0], 1, self.quantiles)
            q = value + adv - adv.mean(dim=1, keepdim=True)
        return q.mean(dim=2) if self.quantiles and not quantiles else q


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
        # the first convolution as a space-to-depth one (same function, same parameters): see conv_space_to_depth
        self.space_to_depth = False

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = _scaled(frames)
        if self.space_to_depth:
            return self.convs[1:](conv_space_to_depth(x, self.convs[0]))
        return self.convs(x)


def use_space_to_depth(net: nn.Module, setting: str, device_type: str) -> bool:
    """Turn the space-to-depth first convolution on or off in `net`'s Nature torso (`learner.space_to_depth`:
    auto is on with CUDA); True when it is on. Other torsos have no such layer and stay as they are."""
    on = setting == "on" or (setting == "auto" and device_type == "cuda")
    torso = getattr(net, "torso", None)
    if not isinstance(torso, NatureCNN):
        return False
    torso.space_to_depth = on
    return on


def conv_space_to_depth(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """`conv(x)` for a convolution whose kernel is a multiple m of its stride s (Nature's first layer: 8 and 4),
    computed as an m x m stride-1 convolution over x rearranged space-to-depth (each s x s block of pixels
    becomes s*s channels) with the weights rearranged the same way: the same sums, in another order. Four input
    channels leave GPU tensor cores mostly idle (cuDNN falls back to slow kernels); 4*s*s = 64 fit them."""
    (kh, kw), (sh, sw) = conv.kernel_size, conv.stride
    if kh % sh or kw % sw or conv.padding != (0, 0) or conv.dilation != (1, 1) or conv.groups != 1:
        raise ValueError(f"conv_space_to_depth: kernel {conv.kernel_size} must be a multiple of stride {conv.stride}, "
                         "without padding, dilation or groups")
    mh, mw = kh // sh, kw // sw
    b, c, h, w = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    hh, ww = (oh + mh - 1) * sh, (ow + mw - 1) * sw  # the rows and columns the convolution reads
    x = x[:, :, :hh, :ww].reshape(b, c, hh // sh, sh, ww // sw, sw).permute(0, 1, 3, 5, 2, 4)
    x = x.reshape(b, c * sh * sw, hh // sh, ww // sw)
    o = conv.weight.shape[0]
    wt = conv.weight.reshape(o, c, mh, sh, mw, sw).permute(0, 1, 3, 5, 2, 4).reshape(o, c * sh * sw, mh, mw)
    return nn.functional.conv2d(x, wt, conv.bias)


def _scaled(frames: torch.Tensor) -> torch.Tensor:
    """uint8 frames to floats in [0, 1] (float input passes as it is): the network scales, so uint8 is what
    travels, is stored and is gathered."""
    return frames.float().div_(255.0) if frames.dtype == torch.uint8 else frames


class ResidualBlock(nn.Module):
    """x + conv1(relu(conv0(relu(x)))), both convs 3x3 with padding 1 (the shape is kept)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaStage(nn.Module):
    """conv3x3 (padding 1) -> maxpool 3x3 stride 2 (padding 1: the side halves, rounded up) -> 2 residual blocks."""

    def __init__(self, in_channels: int, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.blocks = nn.Sequential(ResidualBlock(channels), ResidualBlock(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.pool(self.conv(x)))


IMPALA_CHANNELS = (16, 32, 32)  # per stage, multiplied by learner.encoder_width


class ImpalaCNN(nn.Module):
    """Espeholt et al. 2018's residual torso: three stages, then ReLU and flatten (the head's first Linear
    is the encoder's final linear layer). Features: 32 * width * s_h * s_w, s = ceil(side / 8) after three
    halvings rounded up (11 x 11 for 84 x 84)."""

    def __init__(self, stack: int, frame_hw: tuple[int, int], width: int = 1) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"encoder_width={width}: need at least 1")
        stages, in_channels = [], stack
        for channels in IMPALA_CHANNELS:
            stages.append(ImpalaStage(in_channels, channels * width))
            in_channels = channels * width
        self.stages = nn.Sequential(*stages)
        self.out = nn.Sequential(nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            self.out_features = int(self.forward(torch.zeros(1, stack, *frame_hw)).shape[1])

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.out(self.stages(_scaled(frames)))


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

    def forward(self, obs: torch.Tensor, quantiles: bool = False) -> torch.Tensor:
        """Q-values [B, A]; with `quantiles` (a QR-DQN head only) the return quantiles [B, A, N]."""
        return self.head(self.torso(obs), quantiles)

    def noisy_layers(self) -> list[NoisyLinear]:
        return [m for m in self.modules() if isinstance(m, NoisyLinear)]

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw new noise in every NoisyLinear layer (none: nothing to do)."""
        for layer in self.noisy_layers():
            layer.reset_noise(generator)

    def set_noise(self, on: bool) -> QNetwork:
        """Noisy weights (acting, learning) or their means (evaluation); returns self so calls chain."""
        for layer in self.noisy_layers():
            layer.noise = bool(on)
        return self


def build_q_network(
    obs_shape: Sequence[int],
    stack: int,
    num_actions: int,
    hidden: int = 512,
    dueling: bool = True,
    encoder: str = "nature",
    encoder_width: int = 1,
    quantiles: int = 0,
    noisy_sigma: float = 0.0,
) -> QNetwork:
    """One factory for collectors and learner: same architecture, same init, same inputs.

    `obs_shape` is one observation's shape ((H, W) for frames, (D,) for vectors); the network
    input is [B, stack, *obs_shape]. `encoder` ("nature" or "impala") and `encoder_width` (the
    impala channel multiplier; 1 with nature) pick the frames' torso; vectors take the MLP and
    accept only the defaults. `quantiles` > 0 makes it a QR-DQN network (DuelingHead), `noisy_sigma` > 0 a
    NoisyNet one (the head's layers; NoisyLinear keeps its own init, He init the rest).
    """
    if num_actions < 1:
        raise ValueError(f"num_actions={num_actions}: need at least one action")
    if encoder not in ENCODERS:
        raise ValueError(f"encoder={encoder!r}: allowed {', '.join(ENCODERS)}")
    if encoder_width != 1 and encoder != "impala":
        raise ValueError(f"encoder_width={encoder_width}: only the impala encoder has a width (nature takes 1)")
    if is_image_obs(obs_shape):
        frame_hw = (int(obs_shape[0]), int(obs_shape[1]))
        if encoder == "impala":
            torso: nn.Module = ImpalaCNN(stack, frame_hw, int(encoder_width))
        else:
            torso = NatureCNN(stack, frame_hw)
    else:
        if encoder != "nature":
            raise ValueError(f"encoder={encoder!r}: vector observations {tuple(obs_shape)} take the MLP torso "
                             "(the encoders are for 2-D frames)")
        flat = stack
        for dim in obs_shape:
            flat *= int(dim)
        torso = VectorMLP(flat, hidden)
    net = QNetwork(torso, DuelingHead(torso.out_features, hidden, num_actions, dueling, int(quantiles),
                                      float(noisy_sigma)))
    _he_init(net)
    return net


def build_q_network_for(spec: EnvSpec, lc: LearnerConfig) -> QNetwork:
    """`build_q_network` for an env's spec and the learner section of a run's config: what the collector, the
    learner and the WEIGHTS template all build."""
    return build_q_network(spec.obs_shape, spec.stack, spec.num_actions, lc.hidden, lc.dueling, lc.encoder,
                           lc.encoder_width, lc.quantiles, lc.noisy_sigma)


def _he_init(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
