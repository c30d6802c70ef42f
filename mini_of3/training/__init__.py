"""The trainer's machinery, one idea per file; ``mini_of3.trainer`` composes them into the loop.

    optim.py       AdamW and AF3's learning-rate schedule (SI 5.4); the per-step recycle count and seeds
    ema.py         exponential moving average of the weights, swapped in for validation and saved for predict
    checkpoint.py  checkpoint folders: atomic write, listing, best/latest, pruning, RNG states
    runlog.py      log.jsonl, wandb (offline unless a key is set), the stall watchdog
    plots.py       PNG plots of the losses and the validation metrics
"""
