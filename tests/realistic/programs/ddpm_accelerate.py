"""Denoising-diffusion training, shaped like Hugging Face diffusers'
``examples/unconditional_image_generation/train_unconditional.py`` (with the min-SNR loss
weighting of its ``train_text_to_image.py``): an ``accelerate`` loop with gradient
accumulation, a small UNet conditioned on the timestep, a DDPM noise scheduler, a cosine
schedule with warmup (a ``LambdaLR`` over a closure, as ``get_scheduler`` makes), gradient
clipping through the accelerator, gradients dropped with ``param.grad = None`` and an EMA of the
weights (``EMAModel``-like: shadow tensors, a decay that follows the step count,
``state_dict``). The noise and each sample's timestep are drawn inside the step from the
global generator, so a step only replays if its RNG does. Synthetic images (the example loads
a dataset), the same shapes and dtypes.

Wired for replay as a user would add it to the loop (changed lines marked ``# replay``): the
Recorder is opened once in ``main()`` with the objects that carry state (the EMA included), the
loop's body becomes ``train_step(batch)`` and the loop hands each batch over with
``replay.step``; the logging stays outside the step.

Before its Recorder the program writes ``train.log`` (a line per optimizer step) and
``config.json`` (its arguments): a replay must leave both as they are.

The planted failure: ``--zero-terminal-snr`` rescales the betas so that the last timestep has
no signal left (``alphas_cumprod[-1] == 0``, as diffusers' ``rescale_betas_zero_snr`` does),
and ``--snr-gamma`` weights the loss by ``min(snr, gamma) / snr``: a sample whose timestep is the
last divides 0 by 0 (diffusers' issue, fixed there by setting those weights to 1). The timesteps
are random, so the first step that draws the last timestep is the first NaN: step 6 with the
defaults, sample 0, ``aten::div`` on the line marked ``# min-SNR``. Without the flag the run is
healthy.

    python ddpm_accelerate.py [--record run.h5] [--steps 24] [--zero-terminal-snr]
"""

import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

import replay  # replay


class Images(Dataset):
    """Images in [-1, 1], 3x16x16, as the example's transforms leave them."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.rand(n, 3, 16, 16, generator=g) * 2 - 1

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"input": self.images[i]}


def timestep_embedding(timesteps, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = timesteps[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Block(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class TinyUNet(nn.Module):
    def __init__(self, ch=16, tdim=32):
        super().__init__()
        self.tdim = tdim
        self.time_mlp = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.down = Block(ch, 2 * ch, tdim)
        self.mid = Block(2 * ch, 2 * ch, tdim)
        self.up = Block(4 * ch, ch, tdim)
        self.conv_out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x, timesteps):
        temb = self.time_mlp(timestep_embedding(timesteps, self.tdim))
        h0 = self.conv_in(x)
        h1 = self.down(F.avg_pool2d(h0, 2), temb)
        h2 = self.mid(h1, temb)
        h = F.interpolate(torch.cat([h2, h1], dim=1), scale_factor=2.0, mode="nearest")
        return self.conv_out(self.up(h, temb))


class DDPMScheduler:
    def __init__(self, num_train_timesteps, zero_terminal_snr=False):
        self.num_train_timesteps = num_train_timesteps
        betas = torch.linspace(1e-4, 0.2, num_train_timesteps, dtype=torch.float32)
        if zero_terminal_snr:
            betas = rescale_zero_terminal_snr(betas)
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)

    def add_noise(self, original, noise, timesteps):
        sqrt_alpha = self.alphas_cumprod[timesteps] ** 0.5
        sqrt_one_minus = (1 - self.alphas_cumprod[timesteps]) ** 0.5
        return (
            sqrt_alpha[:, None, None, None] * original + sqrt_one_minus[:, None, None, None] * noise
        )


def rescale_zero_terminal_snr(betas):
    """Shift and scale sqrt(alphas_cumprod) so that the last is 0 and the first unchanged."""
    alphas_bar_sqrt = torch.cumprod(1.0 - betas, dim=0).sqrt()
    first, last = alphas_bar_sqrt[0].clone(), alphas_bar_sqrt[-1].clone()
    alphas_bar_sqrt -= last
    alphas_bar_sqrt *= first / (first - last)
    alphas_bar = alphas_bar_sqrt**2
    alphas = torch.cat([alphas_bar[0:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


def compute_snr(noise_scheduler, timesteps):
    alphas_cumprod = noise_scheduler.alphas_cumprod
    alpha = alphas_cumprod[timesteps] ** 0.5
    sigma = (1.0 - alphas_cumprod[timesteps]) ** 0.5
    return (alpha / sigma) ** 2


class EMAModel:
    """The shadow weights of diffusers' ``EMAModel``: a decay that warms up with the step count."""

    def __init__(self, parameters, decay=0.999, inv_gamma=1.0, power=2 / 3):
        self.shadow_params = [p.detach().clone() for p in parameters]
        self.decay, self.inv_gamma, self.power = decay, inv_gamma, power
        self.optimization_step = 0
        self.cur_decay_value = 0.0

    def get_decay(self, step):
        value = 1 - (1 + step / self.inv_gamma) ** -self.power
        return 0.0 if step <= 0 else min(value, self.decay)

    @torch.no_grad()
    def step(self, parameters):
        self.optimization_step += 1
        self.cur_decay_value = decay = self.get_decay(self.optimization_step)
        for s, p in zip(self.shadow_params, parameters):
            s.sub_((1 - decay) * (s - p))

    def state_dict(self):
        return {
            "decay": self.decay,
            "optimization_step": self.optimization_step,
            "cur_decay_value": self.cur_decay_value,
            "shadow_params": self.shadow_params,
        }

    def load_state_dict(self, state):
        self.decay = state["decay"]
        self.optimization_step = state["optimization_step"]
        self.cur_decay_value = state["cur_decay_value"]
        for s, p in zip(self.shadow_params, state["shadow_params"]):
            s.copy_(p)


def cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        progress = float(current_step - num_warmup_steps) / float(
            max(1, num_training_steps - num_warmup_steps)
        )
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", default="run.h5")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--train-batch-size", type=int, default=4)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--num-train-timesteps", type=int, default=50)
    parser.add_argument("--snr-gamma", type=float, default=5.0)
    parser.add_argument("--zero-terminal-snr", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with open("config.json", "w") as f:
        json.dump(vars(args), f)
    log = open("train.log", "w")  # noqa: SIM115 - open for the whole run, as a logger's file

    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=True
    )
    torch.manual_seed(args.seed)
    model = TinyUNet()
    noise_scheduler = DDPMScheduler(args.num_train_timesteps, args.zero_terminal_snr)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=1e-2)
    train_dataloader = DataLoader(
        Images(args.steps * args.train_batch_size), batch_size=args.train_batch_size, shuffle=True
    )
    lr_scheduler = cosine_schedule_with_warmup(
        optimizer, 4, args.steps // args.gradient_accumulation_steps
    )
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    ema_model = EMAModel(model.parameters())
    replay.Recorder(args.record, objects={"model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler, "accelerator": accelerator, "ema": ema_model})  # replay  # fmt: skip

    def train_step(batch):  # replay (was the loop's body)
        clean_images = batch["input"]
        noise = torch.randn(clean_images.shape).to(clean_images.device)
        bsz = clean_images.shape[0]
        timesteps = torch.randint(
            0, noise_scheduler.num_train_timesteps, (bsz,), device=clean_images.device
        ).long()
        noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)

        with accelerator.accumulate(model):
            noise_pred = model(noisy_images, timesteps)
            snr = compute_snr(noise_scheduler, timesteps)
            mse_loss_weights = torch.stack([snr, args.snr_gamma * torch.ones_like(timesteps)], dim=1).min(dim=1)[0] / snr  # min-SNR  # fmt: skip
            loss = F.mse_loss(noise_pred.float(), noise.float(), reduction="none")
            loss = (loss.mean(dim=list(range(1, loss.ndim))) * mse_loss_weights).mean()
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_scheduler.step()
            if accelerator.sync_gradients:
                ema_model.step(model.parameters())
            for param in model.parameters():
                param.grad = None
        return loss  # replay

    global_step = 0
    for batch in train_dataloader:
        loss = replay.step(batch, train_step)  # replay
        if accelerator.sync_gradients:
            global_step += 1
            logs = {"loss": loss.detach().item(), "lr": lr_scheduler.get_last_lr()[0]}
            print(f"step {global_step} {json.dumps(logs)}", file=log, flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
