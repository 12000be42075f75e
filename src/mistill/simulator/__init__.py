"""The `simulator` CLI group: the learned answer simulator of LAS (App. K); the code is `mistill.evaluate.simulator`."""
