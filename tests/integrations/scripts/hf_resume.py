"""A Hugging Face Trainer run that saves a checkpoint at step 6 and stops, then is resumed from it
with ``train(resume_from_checkpoint=...)`` to step 12, both recorded by ReplayCallback to
OUT_DIR/run.h5 (the tiny classifier of hf_recorded.py).

    python hf_resume.py OUT_DIR first    # global steps 1..6, OUT_DIR/checkpoint-6
    python hf_resume.py OUT_DIR resume   # global steps 7..12
"""

import argparse
import os
import sys

import torch
from transformers import Trainer, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_recorded import RandomData, TinyClassifier, TinyConfig  # noqa: E402

from replay.integrations.transformers import ReplayCallback  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("phase", choices=["first", "resume"])
    args = p.parse_args()
    torch.manual_seed(0)
    training = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=8,
        max_steps=6 if args.phase == "first" else 12,
        learning_rate=0.01,
        use_cpu=True,
        seed=0,
        report_to="none",
        save_strategy="steps",
        save_steps=6,
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=TinyClassifier(TinyConfig()),
        args=training,
        train_dataset=RandomData("tiny"),
        callbacks=[ReplayCallback(f"{args.out}/run.h5")],
    )
    if args.phase == "first":
        trainer.train()
    else:
        trainer.train(resume_from_checkpoint=f"{args.out}/checkpoint-6")
    print(f"global_step {trainer.state.global_step}")


if __name__ == "__main__":
    main()
