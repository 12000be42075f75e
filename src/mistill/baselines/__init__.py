"""The loss functions of the baseline arms of Table 2 (App. J.3): DistiLLM-2 and Feature-KD."""
