"""The sparse MoE block of the Qwen3.5 MoE family: it stands where a dense layer has its SwiGLU MLP.

    logits = x @ router.T                        [rows, E]   (one GEMM with the shared expert's gate, [rows, 1])
    ids, w = route(logits, k)                    the k most probable experts of each row, their renormalised weights
    routed = SwiGLU_ids(x)                       [rows, k, hidden]: the grouped GEMM over each expert's rows
    shared = SwiGLU_shared(x)                    [rows, hidden]: the always-on shared expert
    out    = sum_n w[:, n] * routed[:, n] + sigmoid(x @ shared_gate.T) * shared

The numerics of each step (the router's order and tie rule, the exact grouped GEMM, the order of the weighted sum)
are tensorfold/cuda/moe.py's. A row's output depends on that row alone, so the block keeps every promise the dense
MLP keeps: prompt rows equal one-row steps, and a row's bits do not depend on which rows share its experts.
"""
import dataclasses

from tensorfold.model.projections import rows_of, stack_projections

# The projections of a sparse block that read x, stacked where they share a form (router and shared gate are 8-bit
# in MLX files, the shared expert's gate and up 4-bit): prefix -> names, as PROJECTIONS.
SPARSE_PROJECTIONS = {"mlp.": ("gate", "shared_expert_gate"), "mlp.shared_expert.": ("gate_proj", "up_proj")}


@dataclasses.dataclass
class Experts:
    """A layer's routed experts on the backend: two stacked Linears, gate_up [E * 2 I, hidden] (each expert's gate
    rows, then its up rows) and down [E * hidden, I], and each expert's rows of them as views."""
    gate_up: object
    down: object
    gate_up_views: list
    down_views: list

    @classmethod
    def upload(cls, gate_up, down, count: int, upload) -> "Experts":
        gate_up, down = upload(gate_up), upload(down)
        size, hidden = gate_up.out_features // count, down.out_features // count
        return cls(gate_up, down, [rows_of(gate_up, e * size, (e + 1) * size) for e in range(count)],
                   [rows_of(down, e * hidden, (e + 1) * hidden) for e in range(count)])


def upload_sparse_block(net, prefix: str, weights: dict) -> None:
    """Upload the sparse block at `prefix` (`layers.3.mlp.`), taking its matrices out of `weights`: its stacked
    projections into net.projections, its experts into net.experts, every weight by name into net.weights."""
    upload = net.ops.upload
    for group, names in SPARSE_PROJECTIONS.items():
        p = prefix + group[len("mlp."):]
        net.projections[p], views = stack_projections(p, names, weights, upload)
        net.weights.update(views)
    experts = Experts.upload(weights.pop(prefix + "experts.gate_up_proj"), weights.pop(prefix + "experts.down_proj"),
                             net.config.num_experts, upload)
    net.experts[prefix] = experts
    net.weights.update({prefix + "experts.gate_up_proj": experts.gate_up, prefix + "experts.down_proj": experts.down})


def sparse_block(net, x, prefix: str):
    """The block's output [rows, hidden] for the rows x [rows, hidden] (normed), in the order of the docstring."""
    ops = net.ops
    logits, gate_logit = net.project(x, prefix)
    ids, weights = ops.route(logits, net.config.num_experts_per_tok)
    routed = ops.routed_experts(x, ids, net.experts[prefix])
    shared = net.swiglu_mlp(x, prefix + "shared_expert.")
    return ops.moe_combine(routed, weights, shared, gate_logit)
