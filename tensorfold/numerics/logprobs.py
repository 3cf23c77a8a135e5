"""Log-probabilities of a row of logits, in float64, for the tokens a request reports."""
import numpy as np


def log_probabilities(logits_row, token: int, top: int) -> tuple:
    """(log-probability of `token`, the `top` most likely (id, log-probability) pairs) under softmax(logits), in
    float64; ties in the top list go to the lower id."""
    row = np.asarray(logits_row, np.float64)
    shifted = row - row.max()
    logp = shifted - np.log(np.exp(shifted).sum())
    best = np.argsort(-logp, kind="stable")[:top]
    return float(logp[token]), [(int(i), float(logp[i])) for i in best]
