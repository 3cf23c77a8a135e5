"""Probe tensorfold-serve as a hostile client would, and the loader with hostile checkpoints; a maintainer's check
of the reliability promises (docs/serving.rst, *Reliability*).

Starts `tensorfold serve` on the embedded model (numpy backend, a free port, an API key) from this checkout, and
sends it some two thousand bad requests (probe_cases.py), each with a timeout; then the fault scenarios
(probe_faults.py): hang-ups, concurrency, slow loris, idle connections, heavy bodies beside /health. Before and
after, a good seeded request of each route must give the same `token_sha256`, and between groups too, so the
server never needs a restart. Last it sends SIGTERM with long streams running, restarts the server for a last
check, and loads each hostile checkpoint folder (probe_checkpoints.py) with the CLI. It prints a summary and writes
every case and its answer to a JSON file; the exit status is 1 if anything failed:

    python tools/probe_server.py --out probe.json
"""
import argparse
import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import probe_cases
import probe_checkpoints
import probe_faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "probe-key"
GOOD = {"/v1/completions": {"prompt": "ROMEO:", "max_tokens": 8, "temperature": 1.0, "seed": 7},
        "/v1/chat/completions": {"messages": probe_cases.USER, "max_tokens": 8, "temperature": 0.8, "seed": 7}}
OPENAI_ERROR = {"message", "type", "param", "code"}
# refusals that name the problem without a field: the context (the prompt and the completion together), and the
# body as a whole (JSON the parser refuses, nesting past the limit), seen before any field is read
WHOLE = ("maximum context length", "the body ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`tensorfold serve` of this checkout in a child process, its output in a log file."""

    def __init__(self, flags: list, log_path: str):
        self.port, self.log_path = free_port(), log_path
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("TENSORFOLD_API_KEY", None)
        self.command = [sys.executable, "-m", "tensorfold.cli", "serve", "--port", str(self.port), *flags]
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        atexit.register(self.kill)  # a probe that stops early leaves no server behind
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise SystemExit(f"the server did not start; its log:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return None


class Probe:
    """Sends cases to one server and judges the answers."""

    def __init__(self, served: Served, timeout: float, parallel: int):
        self.served, self.timeout, self.parallel = served, timeout, parallel
        self.url, self.port, self.auth = served.url, served.port, {"authorization": f"Bearer {KEY}"}
        self.client = httpx.Client(timeout=timeout)
        self.before: dict = {}

    def generate(self, route, body, status=False):
        """The token_sha256 of a request's first choice, streamed or not (with the status and Retry-After if
        `status`); None when it did not answer 200."""
        reply = self.client.post(self.url + route, json=body, headers=self.auth)
        sha = None
        if reply.status_code == 200 and body.get("stream"):
            finals = [json.loads(line[6:]) for line in reply.text.splitlines()
                      if line.startswith("data: {") and '"token_sha256"' in line]
            sha = finals[0]["choices"][0]["token_sha256"] if finals else None
        elif reply.status_code == 200:
            sha = reply.json()["choices"][0]["token_sha256"]
        return (reply.status_code, sha, reply.headers.get("retry-after")) if status else sha

    def tokens(self) -> dict:
        return {route: self.generate(route, body) for route, body in GOOD.items()}

    def sentinel(self) -> bool:
        try:
            return self.tokens() == self.before
        except httpx.HTTPError:
            return False

    def metrics(self) -> dict:
        text = self.client.get(self.url + "/metrics").text
        return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+) ([0-9.e+-]+)$", text, re.M)}

    def health_seconds(self) -> float:
        started = time.monotonic()
        try:
            ok = httpx.get(self.url + "/health", timeout=self.timeout).status_code == 200
        except httpx.HTTPError:
            ok = False
        return time.monotonic() - started if ok else float("inf")

    def send(self, case: dict) -> dict:
        """Send one case; the result is the case (less its body) with status, answer, seconds and verdict."""
        started = time.monotonic()
        headers = dict(case["headers"])
        if case.get("auth", True):
            headers.update(self.auth)
        status, text, media = None, "", ""
        try:
            if "raw" in case:
                data = case["raw"]
                if case.get("auth", True) and data.startswith(b"POST"):
                    data = data.replace(b"\r\n", f"\r\nauthorization: Bearer {KEY}\r\n".encode(), 1)
                status, reply = probe_faults.raw_exchange(self.port, data, self.timeout)
                text = reply.decode("latin-1")
                text = text.partition("\r\n\r\n")[2] or text
            else:
                reply = self.client.request(case["method"], self.url + case["route"], content=case["body"] or None,
                                            headers=headers, follow_redirects=False,
                                            timeout=self.timeout * (4 if case.get("slow") else 1))
                status, text, media = reply.status_code, reply.text, reply.headers.get("content-type", "")
            verdict, note = judge(case, status, text, media)
        except (httpx.TimeoutException, TimeoutError):
            verdict, note = "hang", f"no answer within {self.timeout} s"
        except (httpx.TransportError, OSError) as e:
            verdict, note = ("ok", "closed") if case["expect"] == "http" else ("no answer", repr(e))
        except Exception as e:  # noqa: BLE001 (the probe's own failure to send or read: reported, not raised)
            verdict, note = "probe error", repr(e)
        out = {k: v for k, v in case.items() if k not in ("body", "raw", "headers")}
        return {**out, "status": status, "verdict": verdict, "note": note, "answer": text[:300],
                "seconds": round(time.monotonic() - started, 3)}


def judge(case: dict, status, text: str, media: str) -> tuple:
    """(verdict, note): "ok", or what broke a promise."""
    expect, field = case["expect"], case.get("field")
    if status is None:
        return ("ok", "closed") if expect == "http" else ("no answer", "")
    if status >= 500:
        return "5xx", ""
    if expect == "http":
        return "ok", ""
    if isinstance(expect, tuple) and status not in expect:
        return "unexpected status", f"expected {expect}"
    if 400 <= status < 500:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return "not OpenAI-shaped", ""
        if set(error) != OPENAI_ERROR or error["code"] != status:
            return "not OpenAI-shaped", ""
        named = field is None or error["param"] == field or field in error["message"] or any(w in error["message"] for w in WHOLE)
        if status == 400 and not named:
            return "field not named", f"param {error['param']!r}"
        return "ok", "refused" if expect == "new" else ""
    if status == 200 and case["route"] in (probe_cases.CHAT, probe_cases.COMPLETIONS) and case["method"] == "POST":
        return judge_answer(case, text, media)
    return "ok", "accepted for now" if expect == "new" else ""


def judge_answer(case: dict, text: str, media: str) -> tuple:
    """A 200 of a generation route: every choice has its token_sha256 (a stream: its final chunk, no error event,
    [DONE] last), and no more tokens than asked for where the case says how many."""
    note = "accepted for now" if case["expect"] == "new" else "wrong type accepted" if case.get("wrong_type") else ""
    if media.startswith("text/event-stream"):
        data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        if not data or data[-1] != "[DONE]":
            return "stream unfinished", ""
        chunks = [json.loads(d) for d in data[:-1]]
        if any("error" in c for c in chunks):
            return "5xx", "an error event in the stream"
        return "ok", note
    answer = json.loads(text)
    if not all("token_sha256" in c for c in answer["choices"]):
        return "no token_sha256", ""
    limit = case.get("max_completion_tokens")
    if limit is not None and answer["usage"]["completion_tokens"] > limit * len(answer["choices"]):
        return "more tokens than asked", f"{answer['usage']['completion_tokens']} > {limit}"
    return "ok", note


def tracebacks(log: str) -> int:
    return log.count("Traceback (most recent call last)")


def startup_cases() -> list:
    """An empty API key, from the flag or the environment, is refused at start with exit status 2."""
    found = []
    env = {**os.environ, "PYTHONPATH": ROOT}
    for name, flags, extra in (("--api-key ''", ["--api-key", ""], {}), ("TENSORFOLD_API_KEY=''", [],
                                                                         {"TENSORFOLD_API_KEY": ""})):
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "tensorfold.cli", "serve", "--port", str(free_port()), *flags],
                             cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, timeout=60)
        ok = run.returncode == 2 and "API key" in run.stderr and len(run.stderr.strip().splitlines()) == 1
        found.append({"group": "startup", "name": f"an empty key: {name}", "verdict": "ok" if ok else "failed",
                      "note": run.stderr.strip()[:300], "status": run.returncode,
                      "seconds": round(time.monotonic() - started, 3)})
    return found


def run_requests(probe: Probe, cases: list, results: list, echo) -> None:
    """Each case in turn, a sentinel after each group; stop early if the server is wedged."""
    hangs, group = 0, None
    for case in cases + [None]:
        if case is None or case["group"] != group:
            if group is not None:
                same = probe.sentinel()
                results.append({"group": "sentinel", "name": f"after {group}", "verdict": "ok" if same else "failed",
                                "note": "same tokens" if same else "the good requests changed or failed"})
                echo(f"  {group:16} {sum(r['group'] == group for r in results):5} cases; good request "
                     f"{'same' if same else 'CHANGED'}")
            group = case and case["group"]
        if case is None:
            return
        results.append(probe.send(case))
        if results[-1]["verdict"] != "ok":
            echo(f"    FAILED {case['name'][:100]}: {results[-1]['verdict']} {results[-1]['status']} "
                 f"{results[-1]['note']} {results[-1]['answer'][:120]!r}")
        hangs = hangs + 1 if results[-1]["verdict"] == "hang" else 0
        if hangs >= 3:
            results.append({"group": "sentinel", "name": "wedged", "verdict": "failed",
                            "note": f"three hangs in a row at {case['name']}: the rest skipped"})
            return


def summary(results: list, log_text: str, before: dict, after: dict, health: int) -> dict:
    requests = [r for r in results if "status" in r and r["group"] not in ("startup", "checkpoints")]
    by_class = {f"{k}xx": sum(1 for r in requests if r["status"] is not None and r["status"] // 100 == k)
                for k in (2, 3, 4, 5)}
    failed = [r for r in results if r["verdict"] != "ok"]
    checkpoints = [r for r in results if r["group"] == "checkpoints"]
    return {
        "requests": len(requests), **by_class, "closed": sum(r["status"] is None for r in requests),
        "hangs": sum(r["verdict"] == "hang" for r in results),
        "new fields refused": sum(r.get("note") == "refused" for r in requests),
        "new fields accepted for now": sum(r.get("note") == "accepted for now" for r in requests),
        "wrong types accepted": sum(r.get("note") == "wrong type accepted" for r in requests),
        "faults": sum(r["group"] == "faults" for r in results),
        "faults held": sum(r["group"] == "faults" and r["verdict"] == "ok" for r in results),
        "checkpoints": len(checkpoints), "checkpoints refused": sum(r["verdict"] == "ok" for r in checkpoints),
        "tracebacks in the server log": tracebacks(log_text),
        "token_sha256 before": before, "token_sha256 after": after, "same tokens": before == after,
        "health at the end": health, "failures": len(failed),
    }


FAULTS = (probe_faults.hang_up_before_the_answer, probe_faults.hang_up_a_stream, probe_faults.hang_up_while_queued,
          probe_faults.hang_up_mid_body, probe_faults.concurrent_equal_solo, probe_faults.slow_loris,
          probe_faults.idle_connections, probe_faults.heavy_bodies, probe_faults.pipelined)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="probe.json", help="where to write every case and its answer (default probe.json)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take before it counts as a hang")
    p.add_argument("--context", type=int, default=256, help="the server's --context (default 256)")
    p.add_argument("--grace", type=float, default=2.0, help="the server's --shutdown-grace (default 2)")
    p.add_argument("--only", help="comma-separated words: only the request groups whose names hold one, and the "
                   "faults, sigterm or checkpoints part if named (default: everything)")
    args = p.parse_args(argv)
    words = args.only.split(",") if args.only else None

    def wanted(name):
        return words is None or any(word in name for word in words)

    parallel, max_queue = 4, 4
    flags = ["--backend", "numpy", "--context", str(args.context), "--parallel", str(parallel), "--max-queue",
             str(max_queue), "--api-key", KEY, "--shutdown-grace", str(args.grace), "--log-level", "info"]
    workdir = tempfile.mkdtemp(prefix="tensorfold-probe-")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    echo = lambda line: print(line, flush=True)  # noqa: E731
    echo(f"# tensorfold probe at {commit.strip()}; server and checkpoints in {workdir}")
    results = startup_cases() if wanted("startup") else []
    served = Served(flags, os.path.join(workdir, "server.log"))
    probe = Probe(served, args.timeout, parallel)
    probe.before = probe.tokens()
    echo(f"# serving at {served.url}: {' '.join(served.command[1:])}")
    echo(f"  good requests before: {probe.before}")
    cases = probe_cases.all_cases(args.context, max_queue, vocab=4096, key=KEY)
    run_requests(probe, [c for c in cases if wanted(c["group"])], results, echo)
    for scenario in FAULTS if wanted("faults") else ():
        found = scenario(probe)
        for r in found if isinstance(found, list) else [found]:
            results.append(r)
            echo(f"  fault {r['name']}: {r['verdict']} ({r['note']})")
    after, health = probe.tokens(), probe.client.get(served.url + "/health").status_code
    models = probe.client.get(served.url + "/v1/models", headers=probe.auth).text
    results.append({"group": "faults", "name": "no host path in /v1/models",
                    "verdict": "ok" if ROOT not in models else "failed", "note": models[:200]})
    echo(f"  good requests after: {'same' if after == probe.before else after}; /health {health}")
    if wanted("sigterm"):
        for r in probe_faults.sigterm_drain(probe, served, args.grace):
            results.append(r)
            echo(f"  fault {r['name']}: {r['verdict']} ({r['note']})")
        again = Served(flags, os.path.join(workdir, "server-again.log"))
        restarted = Probe(again, args.timeout, parallel).tokens()
        results.append({"group": "faults", "name": "a restarted server gives the same tokens",
                        "verdict": "ok" if restarted == probe.before else "failed", "note": str(restarted)})
        again.stop()
        log_text = served.log() + again.log()
    else:
        served.stop()
        log_text = served.log()
    if wanted("checkpoints"):
        results += probe_checkpoints.run_all(os.path.join(workdir, "checkpoints"), ROOT, echo)
        echo(f"  checkpoints      {sum(r['group'] == 'checkpoints' for r in results):5} folders")
    figures = summary(results, log_text, probe.before, after, health)
    with open(args.out, "w") as f:
        json.dump({"commit": commit.strip(), "command": " ".join(["python", *sys.argv]), "server": served.command,
                   "summary": figures, "cases": results}, f, indent=1, default=str)
    echo("# summary")
    for name, value in figures.items():
        echo(f"  {name:30} {value}")
    for r in results:
        if r["verdict"] != "ok":
            echo(f"  FAILED [{r['group']}] {r['name'][:90]}: {r['verdict']} {r.get('status', '')} "
                 f"{r.get('note', '')} {r.get('answer', '')[:160]!r}")
    echo(f"# every case in {args.out}; the servers' logs in {workdir}")
    bad = figures["failures"] or figures["tracebacks in the server log"] or not figures["same tokens"] or health != 200
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
