"""`tensorfold bench decode|prefill`: the in-process benchmark runs end to end on the numpy backend at the tiny
config, and its JSON holds every number, each positive."""
import json

import pytest

from tensorfold.cli.main import main

FAST = ["--config", "tiny", "--backend", "numpy", "--tokens", "3", "--warmup", "2", "--copy-mib", "4",
        "--gemv-repeats", "2"]


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and v > 0 for v in values)


def test_decode(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", *FAST, "--streams", "1,2", "--cache", str(tmp_path), "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    decode = results["decode"]
    assert [level["streams"] for level in decode["levels"]] == [1, 2]
    for level in decode["levels"]:
        assert level["tokens"] == 3 * level["streams"]
        assert positive(level["tok_s"], level["ms_per_round"], level["stream_bytes"], level["state_bytes"],
                        level["calls_per_round"], level["launch_ms_per_round"], level["warmup_seconds"])
    assert decode["levels"][1]["calls_per_round"] > decode["levels"][0]["calls_per_round"]  # the conv, scan, ...
    assert positive(*decode["floor"].values(), decode["us_per_call"])
    ops = {op["op"]: op for op in decode["ops"]["ops"]}
    # every call of the model is timed, and the engine's draw besides
    assert sum(op["calls"] for op in ops.values()) >= decode["levels"][0]["calls_per_round"]
    assert ops["sample_rows"]["calls"] == 1
    assert decode["ops"]["ms_per_round"] >= sum(op["ms"] for op in ops.values()) > 0
    assert [g["weight"] for g in decode["gemv"]][0] == "lm_head.weight"  # the tiny config has an untied head
    assert all(positive(g["bytes"], g["seconds"], g["bytes_per_s"]) for g in decode["gemv"])
    assert results["weight_bytes"] > decode["floor"]["round_bytes"] > 0  # an untied embedding is read by rows
    assert "skipped" in results["peer"]  # not asked for, and the numpy backend does not run it by default
    drafted = decode["drafted_round"]  # every round a chain of 16 rows: at least one token a round, often more
    assert drafted["rows"] == 16 and drafted["tokens"] >= 3 and positive(drafted["ms_per_round"],
                                                                         drafted["undrafted_ms_per_round"])
    table = capsys.readouterr().out
    assert "decode, 2 streams (aggregate tok/s)" in table and "HBM floor" in table and "launch model" in table
    assert "a chain of 16 rows every round" in table
    assert "#   decode x2: 2 warm-up rounds" in table  # said before the warm-up, which on a GPU compiles the kernels


def test_draft_rows_out_of_range_are_refused(tmp_path, capsys):
    assert main(["bench", "decode", *FAST, "--draft-rows", "17", "--cache", str(tmp_path)]) == 2
    assert "--draft-rows must be between 1 and 16" in capsys.readouterr().err


def test_prefill_beside_the_peer(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "prefill.json"
    assert main(["bench", "prefill", *FAST, "--lengths", "40,20", "--peer", "--cache", str(tmp_path),
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [p["tokens"] for p in results["prefill"]] == [20, 40]
    for entry in results["prefill"]:
        assert positive(entry["tok_s"], entry["seconds"], entry["stream_bytes"], entry["state_bytes"])
    peer = results["peer"]
    assert peer["device"] == "cpu" and set(peer["fast_paths"]) == {"flash-linear-attention", "causal-conv1d"}
    assert [p["tokens"] for p in peer["prefill"]] == [20, 40] and all(positive(p["tok_s"]) for p in peer["prefill"])
    assert "cold prefill, 40 tokens (tok/s)" in capsys.readouterr().out


def test_a_length_projected_past_the_limit_is_skipped(tmp_path):
    out = tmp_path / "prefill.json"
    assert main(["bench", "prefill", *FAST, "--lengths", "8,16,32", "--max-seconds", "0.0001", "--no-peer",
                 "--cache", str(tmp_path), "--json", str(out)]) == 0
    first, second, third = json.loads(out.read_text())["prefill"]
    assert "skipped" not in first  # nothing measured before it to project from
    assert "projected" in second["skipped"] and "projected" in third["skipped"]


def test_the_checkpoint_is_written_once(tmp_path, capsys):
    for _ in range(2):
        assert main(["bench", "prefill", *FAST, "--lengths", "8", "--no-peer", "--cache", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("# writing a random tiny checkpoint") == 1 and "(cached)" in printed


def test_an_unknown_config_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "decode", "--config", "9B", "--backend", "numpy"])
    error = capsys.readouterr().err
    assert "invalid choice: '9B'" in error and "0.8B" in error and "tiny" in error


def test_an_moe_rounds_floor_counts_only_the_experts_a_row_chose(tmp_path):
    """round_bytes reads num_experts_per_tok of num_experts routed experts a layer (control: the dense count, every
    expert, is larger by the unread experts' bytes)."""
    import tensorfold
    from tensorfold.cli.bench.timing import round_bytes
    from tensorfold.model.tiny import TINY_MOE_CONFIG, make_tiny
    make_tiny(str(tmp_path), seed=3, config=TINY_MOE_CONFIG)
    model = tensorfold.load(str(tmp_path), backend="numpy")
    c, weights = model.config, model.net.weights
    experts = sum(w.nbytes for name, w in weights.items() if ".experts." in name)
    assert 0 < c.num_experts_per_tok < c.num_experts and experts > 0
    embedding = weights["embed_tokens.weight"].nbytes if not c.tie_word_embeddings else 0
    every_expert = model.weight_bytes - embedding
    assert round_bytes(model) == every_expert - experts + experts * c.num_experts_per_tok // c.num_experts


def test_a_drafted_round_that_keeps_every_row_has_room(monkeypatch):
    """The drafted-round measure when every guess is accepted (random weights that repeat a token do that): its
    stream keeps 16 tokens a round through the warm-up and the timed rounds, and does not run out of room. The
    guesses here are the model's own greedy tokens."""
    import numpy as np

    import tensorfold
    from tensorfold.cli.bench import local
    from tensorfold.engine import Engine, SamplingParams
    from tensorfold.models import DEFAULT_MODEL
    model = tensorfold.load(DEFAULT_MODEL, backend="numpy")
    warmup, tokens, rows, prompt_tokens = 2, 3, 16, 8
    prompt = np.random.default_rng(5).integers(0, model.config.vocab_size, prompt_tokens).tolist()
    greedy = Engine(model).generate(prompt, SamplingParams(max_tokens=(warmup + tokens) * rows + 1, stop_ids=(),
                                                           draft=False))
    monkeypatch.setattr(local.FullChains, "propose",
                        lambda self, ids, max_rows, state=None: greedy[len(ids) - prompt_tokens:][:max_rows])
    drafted = local.decode_rate(model, 1, tokens, warmup, prompt_tokens, np.random.default_rng(5), rows=rows)
    assert drafted["tokens"] == tokens * rows


def test_chunk(tmp_path, capsys):
    """`bench chunk`: a longer chunk takes the prompt in fewer rounds; the other streams decode all along."""
    out = tmp_path / "chunk.json"
    assert main(["bench", "chunk", "--config", "tiny", "--backend", "numpy", "--streams", "2", "--prompt", "40",
                 "--chunks", "8,40", "--warmup", "2", "--cache", str(tmp_path), "--json", str(out)]) == 0
    levels = json.loads(out.read_text())["levels"]
    assert [(level["chunk"], level["rounds"]) for level in levels] == [(8, 5), (40, 1)]
    for level in levels:
        assert positive(level["ttft_s"], level["longest_round_ms"], level["decode_tok_s_during"],
                        level["decode_tok_s_before"])
    assert "time to first token" in capsys.readouterr().out


def test_chunk_refuses_a_prompt_past_the_context(tmp_path, capsys):
    assert main(["bench", "chunk", "--config", "tiny", "--backend", "numpy", "--prompt", "100000",
                 "--cache", str(tmp_path)]) == 2
    assert "exceeds the tiny config's max_position_embeddings" in capsys.readouterr().err


@pytest.mark.parametrize("order", ["slower first", "faster first"])
def test_each_length_reports_the_faster_of_two_runs(order):
    """A length's first run also compiles what its chunks need beyond the warm-up's, so each length runs twice and
    the faster run is reported, whichever it was."""
    from tensorfold.cli.bench.local import prefill_lengths
    times = iter([2.0, 1.0] if order == "slower first" else [1.0, 2.0])
    results = prefill_lengths(lambda n: {"tokens": n, "seconds": next(times), "tok_s": 1.0}, [8], 60.0, "test")
    assert [r["seconds"] for r in results] == [1.0]
