"""A standard Hugging Face Trainer script: a tiny model built from a config on random data,
dropout, gradient accumulation 2 (an epoch's 11 batches: its last window has one), clipping to
max_grad_norm, AdamW and a linear schedule with warm-up. ``--model gpt2`` trains a 2-layer
GPT-2 (vocab 64, width 16) on random tokens; ``--model tiny`` a small classifier whose
``--nan-at K``-th forward call (counted from 0) takes
log of a negative number. Usage: python hf_plain.py OUT_DIR [--model gpt2|tiny] [--bf16]"""

import argparse

import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PretrainedConfig,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
)


class TinyConfig(PretrainedConfig):
    model_type = "tiny-classifier"

    def __init__(self, width: int = 16, nan_at: int = -1, **kwargs) -> None:
        self.width = width
        self.nan_at = nan_at
        super().__init__(**kwargs)


class TinyClassifier(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.net = nn.Sequential(nn.Linear(8, config.width), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(config.width, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.post_init()

    def forward(self, x, labels=None):
        h = self.net(x)
        if int(self.calls) == self.config.nan_at:
            h = torch.log(h - 100.0)
        self.calls += 1
        logits = self.head(h)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class RandomData(torch.utils.data.Dataset):
    def __init__(self, kind: str, n: int = 88) -> None:
        g = torch.Generator().manual_seed(1)
        if kind == "gpt2":
            ids = torch.randint(0, 64, (n, 12), generator=g)
            self.items = [{"input_ids": t, "labels": t} for t in ids]
        else:
            x, y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
            self.items = [{"x": a, "labels": b} for a, b in zip(x, y)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", default="gpt2", choices=["gpt2", "tiny"])
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    if args.model == "gpt2":
        config = GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=16)
        config.bos_token_id = config.eos_token_id = 0
        model = GPT2LMHeadModel(config)
    else:
        model = TinyClassifier(TinyConfig(nan_at=args.nan_at))
    training = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_grad_norm=0.5,
        num_train_epochs=2,
        learning_rate=0.01,
        warmup_steps=3,
        lr_scheduler_type="linear",
        bf16=args.bf16,
        use_cpu=True,
        seed=0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=RandomData(args.model),
    )
    trainer.train()


if __name__ == "__main__":
    main()
