"""Pure host arithmetic that every layer above shares: the weight formats (bf16, MLX affine), float32 sums rounded
once, and the shapes of a drafted window (chains and trees). Nothing here imports numba.cuda."""
