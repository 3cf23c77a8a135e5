"""`tensorfold bench openai|concurrent|cache`: measure a running tensorfold-serve and check its exactness from the
outside, by the `token_sha256` every choice carries. (`tensorfold bench decode|prefill|all` measure the engine in
this process: local.py.)

* `openai`: one stream at a time, a code-like and a chat prompt, greedy and T=1; median decode tok/s.
* `concurrent --levels 1,4,16`: N clients at once; every reply must equal the same request sent alone and sent
  with `"draft": false`.
* `cache`: a long prompt sent cold, then again; time to first token both ways, and the replies must be equal.
"""
import concurrent.futures
import json
import statistics
import sys
import time
import urllib.error
import urllib.request

from tensorfold.errors import TensorfoldError

CODE_PROMPT = "def fibonacci(n):\n    " + "\n    ".join(f"# step {i}: add the two previous numbers" for i in range(8))
CHAT_PROMPT = "Tell me of the king, his court, and the quarrel between his sons."


class Client:
    """A server's routes, over the standard library's HTTP client (an error status raises urllib's HTTPError)."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 600.0):
        self.url, self.timeout = url.rstrip("/"), timeout
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        try:
            with self.open("/v1/models") as reply:
                self.model = json.load(reply)["data"][0]["id"]
        except urllib.error.URLError as e:
            raise TensorfoldError(f"no tensorfold-serve answers at {self.url}: {e.reason}") from None

    def open(self, route: str, body: dict | None = None):
        """The reply to a GET, or to a POST of `body` as JSON."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + route, data=data, headers=self.headers)
        return urllib.request.urlopen(request, timeout=self.timeout)

    def chat(self, content: str, **fields) -> dict:
        body = {"model": self.model, "messages": [{"role": "user", "content": content}], **fields}
        started = time.perf_counter()
        with self.open("/v1/chat/completions", body) as reply:
            data = json.load(reply)
        data["seconds"] = time.perf_counter() - started
        return data

    def first_token_seconds(self, prompt: str, **fields) -> tuple:
        """(seconds to the first streamed token, the final chunk) of a streamed completion."""
        body = {"model": self.model, "prompt": prompt, "stream": True, "stream_options": {"include_usage": True},
                **fields}
        started, first, last, usage = time.perf_counter(), None, None, None
        with self.open("/v1/completions", body) as reply:
            for raw in reply:
                line = raw.decode().rstrip("\r\n")
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    first = first or time.perf_counter() - started
                    if chunk["choices"][0]["finish_reason"]:
                        last = chunk["choices"][0]
                else:
                    usage = chunk["usage"]
        return first, last, usage


def bench_openai(client: Client, args) -> dict:
    results = {}
    for name, prompt in (("code", CODE_PROMPT), ("chat", CHAT_PROMPT)):
        for temperature in (0.0, 1.0):
            rates = []
            for rep in range(args.reps):
                reply = client.chat(prompt, max_tokens=args.max_tokens, temperature=temperature, seed=rep)
                rates.append(reply["usage"]["completion_tokens"] / reply["seconds"])
            results[f"{name} T={temperature:g}"] = round(statistics.median(rates), 2)
            print(f"{name:5} T={temperature:g}: median {statistics.median(rates):8.2f} tok/s over {args.reps} runs",
                  flush=True)
    return results


def bench_concurrent(client: Client, args) -> dict:
    prompts = [f"{CHAT_PROMPT} ({i})" for i in range(max(args.levels))]

    def ask(i, **fields):
        reply = client.chat(prompts[i], max_tokens=args.max_tokens, temperature=args.temperature, seed=i, **fields)
        return reply["choices"][0]["token_sha256"]

    alone = [ask(i) for i in range(max(args.levels))] if args.alone else None
    plain = [ask(i, draft=False) for i in range(max(args.levels))] if args.serial else None
    results = {}
    for level in args.levels:
        failed = 0
        with concurrent.futures.ThreadPoolExecutor(level) as pool:
            futures = [pool.submit(ask, i) for i in range(level)]
        together = []
        for future in futures:
            try:
                together.append(future.result())
            except Exception:  # noqa: BLE001 (a failed request is counted, not fatal)
                together.append(None)
                failed += 1
        unequal = sum(t is not None and ((alone and t != alone[i]) or (plain and t != plain[i]))
                      for i, t in enumerate(together))
        results[level] = {"requests": level, "unequal": unequal, "failed": failed}
        print(f"x{level:<3} {level} requests: {unequal} unequal, {failed} failed", flush=True)
    return results


def bench_cache(client: Client, args) -> dict:
    prompt = CODE_PROMPT * args.repeat
    cold, cold_last, cold_usage = client.first_token_seconds(prompt, max_tokens=args.max_tokens, temperature=0)
    warm, warm_last, warm_usage = client.first_token_seconds(prompt, max_tokens=args.max_tokens, temperature=0)
    result = {"prompt_tokens": cold_usage["prompt_tokens"], "cold_ttft_s": round(cold, 4),
              "cold_cached_tokens": cold_usage["prompt_tokens_details"]["cached_tokens"],
              "resumed_ttft_s": round(warm, 4),
              "resumed_cached_tokens": warm_usage["prompt_tokens_details"]["cached_tokens"],
              "equal": cold_last["token_sha256"] == warm_last["token_sha256"]}
    print(f"{result['prompt_tokens']} prompt tokens: cold ttft {cold:.3f} s, resumed ttft {warm:.3f} s "
          f"({result['resumed_cached_tokens']} cached), replies {'equal' if result['equal'] else 'UNEQUAL'}",
          flush=True)
    problems = [] if result["equal"] else ["the resumed reply differs from the cold one"]
    if args.require_cold and result["cold_cached_tokens"]:
        problems.append("the first request was not cold (restart the server or change the prompt)")
    if args.require_reuse and not result["resumed_cached_tokens"]:
        problems.append("the second request did not resume from the prompt cache")
    result["problems"] = problems
    return result


def add_parser(commands) -> None:
    bench = commands.add_parser("bench", help="measure a running tensorfold-serve, or the engine in this process")
    kinds = bench.add_subparsers(dest="bench", required=True)
    for name, help_text in (("openai", "single-stream decode speed"), ("concurrent", "concurrent equals solo"),
                            ("cache", "prompt cache: cold versus resumed")):
        p = kinds.add_parser(name, help=help_text)
        p.add_argument("--url", default="http://127.0.0.1:8080")
        p.add_argument("--api-key")
        p.add_argument("--max-tokens", type=int, default=64)
        p.add_argument("--json", action="store_true", help="print the results as one JSON object at the end")
        if name == "openai":
            p.add_argument("--reps", type=int, default=3)
        if name == "concurrent":
            p.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
            p.add_argument("--temperature", type=float, default=0.0)
            p.add_argument("--alone", action="store_true", help="compare with each request sent alone")
            p.add_argument("--serial", action="store_true", help='compare with each request sent with "draft": false')
        if name == "cache":
            p.add_argument("--repeat", type=int, default=8, help="copies of the code prompt (its length)")
            p.add_argument("--require-cold", action="store_true")
            p.add_argument("--require-reuse", action="store_true")
    bench.set_defaults(run=run)
    from tensorfold.cli.bench.local import add_parsers as add_local
    add_local(kinds)
    from tensorfold.cli.bench.drafter import add_parser as add_drafter
    add_drafter(kinds)
    from tensorfold.cli.bench.gemm import add_parser as add_gemm
    add_gemm(kinds)
    from tensorfold.cli.bench.experts import add_parser as add_experts
    add_experts(kinds)
    from tensorfold.cli.bench.scan import add_parser as add_scan
    add_scan(kinds)
    from tensorfold.cli.bench.chunk import add_parser as add_chunk
    add_chunk(kinds)


def run(args) -> int:
    client = Client(args.url, args.api_key)
    result = {"openai": bench_openai, "concurrent": bench_concurrent, "cache": bench_cache}[args.bench](client, args)
    if args.json:
        print(json.dumps(result))
    bad = result.get("problems") if args.bench == "cache" else (
        [lvl for lvl, r in result.items() if r["unequal"] or r["failed"]] if args.bench == "concurrent" else [])
    for problem in bad or []:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if bad else 0
