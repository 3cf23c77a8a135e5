"""The sparse MoE block of the Qwen3.5 MoE family: it stands where a dense layer has its SwiGLU MLP.

    logits = x @ router.T                        [rows, E]   (one GEMM with the shared expert's gate, [rows, 1])
    ids, w = route(logits, k)                    the k most probable experts of each row, their renormalised weights
    routed = SwiGLU_ids(x)                       [rows, k, hidden]: the grouped GEMM over each expert's rows
    shared = SwiGLU_shared(x)                    [rows, hidden]: the always-on shared expert
    out    = sum_n w[:, n] * routed[:, n] + sigmoid(x @ shared_gate.T) * shared

When the shared expert has the routed experts' form and width (Qwen3.5-35B-A3B's: MLX 4-bit, 512 wide), it is
folded in as one more expert, the stacks' last: every row takes it as its rank k in the grouped GEMMs, so it costs
no launches of its own. Its outputs are the same bits either way: the exact GEMM's sums for a row depend on that
row and the weights alone, however the rows are grouped.

The numerics of each step (the router's order and tie rule, the exact grouped GEMM, the order of the weighted sum)
are tensorfold/cuda/moe.py's. A row's output depends on that row alone, so the block keeps every promise the dense
MLP keeps: prompt rows equal one-row steps, and a row's bits do not depend on which rows share its experts.
"""
import dataclasses

from tensorfold.model.projections import form, rows_of, stack_projections, stacked_rows

# The projections of a sparse block that read x, stacked where they share a form, as PROJECTIONS: the router with
# the shared expert's gate (8-bit in MLX files), and the shared expert's gate and up (4-bit) where it is not folded in.
ROUTER_PROJECTIONS = ("gate", "shared_expert_gate")
SHARED_PROJECTIONS = ("gate_proj", "up_proj")


@dataclasses.dataclass
class Experts:
    """A layer's routed experts on the backend: two stacked Linears, gate_up [E * 2 I, hidden] (each expert's gate
    rows, then its up rows) and down [E * hidden, I], and each expert's rows of them as views. With `shared`, the
    stacks hold one expert more, the last: the shared expert."""
    gate_up: object
    down: object
    gate_up_views: list
    down_views: list
    shared: bool = False

    @classmethod
    def upload(cls, gate_up, down, count: int, upload, shared=False) -> "Experts":
        gate_up, down = upload(gate_up), upload(down)
        size, hidden = gate_up.out_features // count, down.out_features // count
        return cls(gate_up, down, [rows_of(gate_up, e * size, (e + 1) * size) for e in range(count)],
                   [rows_of(down, e * hidden, (e + 1) * hidden) for e in range(count)], shared)


def folds(gate_up, down, count: int, shared_gate_up: list, shared_down) -> bool:
    """Whether the shared expert (its gate and up Linears, its down) can be the last expert of the stacks of `count`
    experts: affine (the grouped GEMM's weights), of the experts' form, as wide as one of them."""
    return (gate_up.kind == "affine" and all(form(w) == form(gate_up) for w in shared_gate_up)
            and form(shared_down) == form(down)
            and sum(w.out_features for w in shared_gate_up) == gate_up.out_features // count
            and shared_down.out_features == down.out_features // count)


def upload_sparse_block(net, prefix: str, weights: dict) -> None:
    """Upload the sparse block at `prefix` (`layers.3.mlp.`), taking its matrices out of `weights`: its stacked
    projections into net.projections, its experts into net.experts (the shared expert folded in where `folds`
    allows), every weight by name into net.weights."""
    upload, count = net.ops.upload, net.config.num_experts
    net.projections[prefix], views = stack_projections(prefix, ROUTER_PROJECTIONS, weights, upload)
    net.weights.update(views)
    gate_up, down = weights.pop(prefix + "experts.gate_up_proj"), weights.pop(prefix + "experts.down_proj")
    p = prefix + "shared_expert."
    shared_gate_up = [weights[p + name + ".weight"] for name in SHARED_PROJECTIONS]
    shared_down = weights[p + "down_proj.weight"]
    if not folds(gate_up, down, count, shared_gate_up, shared_down):
        net.projections[p], views = stack_projections(p, SHARED_PROJECTIONS, weights, upload)
        net.weights.update(views)
        experts = Experts.upload(gate_up, down, count, upload)
    else:
        experts = Experts.upload(stacked_rows([gate_up] + shared_gate_up), stacked_rows([down, shared_down]),
                                 count + 1, upload, shared=True)
        last, width = experts.gate_up_views[-1], shared_gate_up[0].out_features
        for name, view in (("gate_proj", rows_of(last, 0, width)), ("up_proj", rows_of(last, width, last.out_features)),
                           ("down_proj", experts.down_views[-1])):
            del weights[p + name + ".weight"]
            net.weights[p + name + ".weight"] = view
    net.experts[prefix] = experts
    net.weights.update({prefix + "experts.gate_up_proj": rows_of(experts.gate_up, 0, gate_up.out_features),
                        prefix + "experts.down_proj": rows_of(experts.down, 0, down.out_features)})


def sparse_block(net, x, prefix: str):
    """The block's output [rows, hidden] for the rows x [rows, hidden] (normed), in the order of the docstring."""
    ops, experts, k = net.ops, net.experts[prefix], net.config.num_experts_per_tok
    logits, gate_logit = net.project(x, prefix)
    routed, weights = ops.route_experts(x, logits, k, experts)
    # folded in, the shared expert's output is every row's rank k of routed, which the combine reads there
    shared = None if experts.shared else net.swiglu_mlp(x, prefix + "shared_expert.")
    return ops.moe_combine(routed, weights, shared, gate_logit)
