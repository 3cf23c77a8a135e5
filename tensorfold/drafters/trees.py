"""Drafted trees: the likeliest paths of a block's per-row top k, best first."""
import heapq
import itertools

import numpy as np


def best_first_tree(logprobs, ids, budget: int, chain_first: bool = False) -> tuple:
    """The `budget` likeliest paths from the root as a tree: (ids, parents), parents[n] an earlier node or -1 for
    the root. A node's score is the sum of the log-probabilities along its path, so its probability is the product of
    the rows' marginals, and these probabilities summed over the tree estimate the tokens a round accepts.

    logprobs and ids [depths, k] are each block row's top k, best first. Best-first search: the first candidate is
    depth 0's best; adding a node offers its next sibling (same parent, next rank) and its first child (next depth,
    rank 0); the best offered candidate is added next (ties: the one offered first). Scores only fall along a path,
    so every node's parent is added before it. With `chain_first` the top-1 chain goes in first, whatever its scores.
    """
    logprobs = np.asarray(logprobs, np.float64)
    depths, k = logprobs.shape
    tokens, parents, offered, order = [], [], [], itertools.count()

    def offer(depth, rank, parent, base):  # heap entry: (-score, offer order, depth, rank, parent, parent's score)
        heapq.heappush(offered, (-(base + logprobs[depth, rank]), next(order), depth, rank, parent, base))

    def add(entry):
        minus_score, _, depth, rank, parent, base = entry
        tokens.append(int(ids[depth][rank]))
        parents.append(parent)
        if rank + 1 < k:
            offer(depth, rank + 1, parent, base)
        if depth + 1 < depths:
            offer(depth + 1, 0, len(tokens) - 1, -minus_score)

    offer(0, 0, -1, 0.0)
    if chain_first:  # node d of the chain is the first child of node d - 1
        for depth in range(min(budget, depths)):
            entry = next(e for e in offered if e[2:5] == (depth, 0, depth - 1))
            offered.remove(entry)
            heapq.heapify(offered)
            add(entry)
    while offered and len(tokens) < budget:
        add(heapq.heappop(offered))
    return tokens, parents
