"""The crop-size ablation behind ``python -m mini_of3.ablate``, one idea per file:

    plan.py       the arms (crops, the AF3 schedule, activations), their seeds, step budget and run folders
    scoring.py    whole-entry scoring of a checkpoint: the splits (large and small training entries, validation)
    stats.py      paired differences between arms over seeds and entries, with bootstrap intervals
    figure.py     quality against crop per split with intervals, beside step time and memory
"""
