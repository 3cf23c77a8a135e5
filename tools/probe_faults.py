"""The fault scenarios of tools/probe_server.py: clients that hang up before, during and after their answer, many
requests at once, slow-loris bodies and headers, idle connections, heavy bodies beside /health, and SIGTERM with long
streams running. Each returns a result dict: group "faults", name, verdict ("ok" or what went wrong), note, seconds.

`probe` is the runner of probe_server.py: its `url`, `port`, `auth` headers, `timeout`, `metrics()`, `sentinel()`
(whether a good seeded request still gives its first tokens) and `health_seconds()`.
"""
import json
import socket
import threading
import time

import httpx

LONG = {"prompt": "x", "max_tokens": 240, "temperature": 0, "draft": False}  # runs for seconds on the CPU


def raw_exchange(port: int, data: bytes, timeout: float, pieces=None):
    """Send `data` (then each (delay, bytes) of `pieces`) on a fresh connection and read until the server closes it:
    (status or None, the reply's bytes). A timeout raises TimeoutError."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            for delay, piece in pieces or ():
                time.sleep(delay)
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole request was in: read its answer
        reply = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            reply += part
        else:
            raise TimeoutError
    while reply.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue): the real one follows
        reply = reply.partition(b"\r\n\r\n")[2]
    if not reply.startswith(b"HTTP/"):
        return None, reply
    return int(reply.split(b" ", 2)[1]), reply


def request_bytes(probe, body: dict, route="/v1/completions") -> bytes:
    content = json.dumps(body).encode()
    auth = "".join(f"{k}: {v}\r\n" for k, v in probe.auth.items())
    return (f"POST {route} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}"
            f"content-length: {len(content)}\r\n\r\n").encode() + content


def wait_for(condition, seconds: float) -> float | None:
    """Seconds until `condition()` holds, or None if it did not within `seconds`."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def result(name, ok, note, started) -> dict:
    return {"group": "faults", "name": name, "verdict": "ok" if ok else "failed", "note": note,
            "seconds": round(time.monotonic() - started, 3)}


def idle(probe) -> bool:
    m = probe.metrics()
    return m.get("tensorfold_active_streams") == 0 and m.get("tensorfold_queue_depth") == 0


def hang_up_before_the_answer(probe) -> dict:
    """Four non-streaming requests whose clients close their sockets while the answers are being made."""
    started = time.monotonic()
    socks = [socket.create_connection(("127.0.0.1", probe.port)) for _ in range(4)]
    for sock in socks:
        sock.sendall(request_bytes(probe, LONG))
    busy = wait_for(lambda: probe.metrics().get("tensorfold_active_streams", 0) >= 4, 20)
    time.sleep(0.5)
    for sock in socks:
        sock.close()
    freed = wait_for(lambda: idle(probe), 10)
    ok = busy is not None and freed is not None and freed < 2 and probe.sentinel()
    return result("non-streaming clients hang up", ok, f"4 lanes busy: {busy is not None}; freed in {freed} s",
                  started)


def hang_up_a_stream(probe) -> dict:
    started = time.monotonic()
    with httpx.stream("POST", probe.url + "/v1/completions", json={**LONG, "stream": True}, headers=probe.auth,
                      timeout=probe.timeout) as reply:
        lines = reply.iter_lines()
        for _ in range(3):
            next(lines)
    freed = wait_for(lambda: idle(probe), 10)
    ok = freed is not None and freed < 2 and probe.sentinel()
    return result("a streaming client hangs up", ok, f"freed in {freed} s", started)


def hang_up_while_queued(probe) -> dict:
    """Clients whose requests wait for a lane hang up: the queue empties, and the lanes' own requests go on."""
    started = time.monotonic()
    busy = [socket.create_connection(("127.0.0.1", probe.port)) for _ in range(probe.parallel)]
    for sock in busy:
        sock.sendall(request_bytes(probe, {**LONG, "stream": True}))
    full = wait_for(lambda: probe.metrics().get("tensorfold_active_streams", 0) >= probe.parallel, 20)
    queued = [socket.create_connection(("127.0.0.1", probe.port)) for _ in range(2)]
    for sock in queued:
        sock.sendall(request_bytes(probe, LONG))
    waiting = wait_for(lambda: probe.metrics().get("tensorfold_queue_depth", 0) >= 2, 10)
    for sock in queued:
        sock.close()
    emptied = wait_for(lambda: probe.metrics().get("tensorfold_queue_depth") == 0, 10)
    running = probe.metrics().get("tensorfold_active_streams")
    for sock in busy:
        sock.close()
    freed = wait_for(lambda: idle(probe), 10)
    ok = None not in (full, waiting, emptied, freed) and running == probe.parallel and probe.sentinel()
    return result("queued clients hang up", ok, f"queue emptied in {emptied} s with {running} lanes still running; "
                  f"all freed in {freed} s", started)


def hang_up_mid_body(probe) -> dict:
    started = time.monotonic()
    head = request_bytes(probe, {"prompt": "x" * 1000})
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", probe.port)) as sock:
            sock.sendall(head[:len(head) - 900])
    time.sleep(0.2)
    health = probe.health_seconds()
    ok = health < 0.5 and probe.sentinel()
    return result("clients hang up in the middle of their bodies", ok, f"/health in {health:.3f} s", started)


def concurrent_equal_solo(probe, count=16) -> dict:
    """`count` different seeded requests, first one at a time, then all at once (retrying each 429 after its
    Retry-After): every answer equals its solo answer."""
    started = time.monotonic()
    bodies = []
    for i in range(count):
        route = "/v1/chat/completions" if i % 2 else "/v1/completions"
        body = {"max_tokens": 6, "temperature": 1.0, "seed": 100 + i, "stream": i % 4 >= 2}
        body.update({"messages": [{"role": "user", "content": f"Speak, friend {i}."}]} if i % 2 else
                    {"prompt": f"ROMEO {i}:"})
        bodies.append((route, body))
    solo = [probe.generate(route, body) for route, body in bodies]
    together, rate_limited = [None] * count, [0]

    def run(i):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answer = probe.generate(*bodies[i], status=True)
            if answer[0] != 429:
                together[i] = answer[1]
                return
            rate_limited[0] += 1
            time.sleep(float(answer[2] or 1))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    equal = sum(a == b and a is not None for a, b in zip(solo, together))
    return result(f"{count} concurrent seeded requests equal solo", equal == count,
                  f"{equal} of {count} equal; {rate_limited[0]} answers of 429 retried", started)


def slow_loris(probe) -> dict:
    """Connections that send their bodies, or their headers, a byte at a time: everyone else is still served."""
    started = time.monotonic()
    stop = threading.Event()
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    head = request_bytes(probe, {"prompt": "x", "max_tokens": 2})[:-len(body)]

    def drip(data, first):
        try:
            with socket.create_connection(("127.0.0.1", probe.port)) as sock:
                sock.sendall(first)
                for byte in data:
                    if stop.wait(0.25):
                        return
                    sock.sendall(bytes([byte]))
        except OSError:
            pass

    threads = [threading.Thread(target=drip, args=(body, head)) for _ in range(20)]
    threads += [threading.Thread(target=drip, args=(head[4:], head[:4])) for _ in range(10)]
    for t in threads:
        t.start()
    time.sleep(1)
    health = max(probe.health_seconds() for _ in range(5))
    tokens = probe.sentinel()
    stop.set()
    for t in threads:
        t.join()
    return result("30 slow-loris connections", health < 0.5 and tokens,
                  f"/health in {health:.3f} s at most; good request {'same' if tokens else 'DIFFERENT'}", started)


def idle_connections(probe, count=300) -> dict:
    started = time.monotonic()
    socks = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", probe.port)))
        health, tokens = probe.health_seconds(), probe.sentinel()
    finally:
        for sock in socks:
            sock.close()
    return result(f"{count} idle connections", health < 0.5 and tokens, f"/health in {health:.3f} s", started)


def heavy_bodies(probe) -> list:
    """Each heavy request, while it is being read, tokenized or answered, leaves /health quick."""
    heavy = {"/tokenize of a 3.9 MB prompt": ("/tokenize", {"prompt": "thou art " * 450_000}),
             "/detokenize of 600k ids": ("/detokenize", {"tokens": [7] * 600_000}),
             "a 3.9 MB chat message": ("/v1/chat/completions", {"messages": [{"role": "user", "content":
                                                                               "thou art " * 450_000}]}),
             "a body of 900k list items": ("/v1/completions", {"prompt": "x", "stop": [0] * 900_000}),
             "a prompt of 600k ids": ("/v1/completions", {"prompt": [7] * 600_000})}
    found = []
    for name, (route, body) in heavy.items():
        started = time.monotonic()
        answer = {}
        content = json.dumps(body).encode()
        worker = threading.Thread(target=lambda: answer.setdefault("status", httpx.post(
            probe.url + route, content=content, headers={**probe.auth, "content-type": "application/json"},
            timeout=probe.timeout).status_code))
        worker.start()
        time.sleep(0.1)
        slowest = 0.0
        while worker.is_alive():
            slowest = max(slowest, probe.health_seconds())
        worker.join()
        status = answer.get("status")
        ok = slowest < 0.5 and status is not None and status < 500
        found.append(result(f"/health beside {name}", ok, f"answered {status}; /health in {slowest:.3f} s at most",
                            started))
    return found


def pipelined(probe) -> dict:
    started = time.monotonic()
    one = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    status, reply = raw_exchange(probe.port, one * 2 + b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                                 probe.timeout)
    answers = reply.count(b"HTTP/1.1 200")
    return result("3 pipelined requests on one connection", answers == 3, f"{answers} answers of 200", started)


def sigterm_drain(probe, served, grace: float) -> list:
    """SIGTERM with long streams and a long request running: 503 to new requests and /health while draining, every
    cut stream ends with its final chunk and [DONE], the answer so far for the other, exit status 0, no traceback."""
    started = time.monotonic()
    streams = [[] for _ in range(3)]
    plain = {}

    def read(lines):
        with httpx.stream("POST", probe.url + "/v1/completions", json={**LONG, "stream": True}, headers=probe.auth,
                          timeout=probe.timeout) as reply:
            lines.extend(line for line in reply.iter_lines() if line)

    threads = [threading.Thread(target=read, args=(lines,)) for lines in streams]
    threads.append(threading.Thread(target=lambda: plain.setdefault("reply", httpx.post(
        probe.url + "/v1/completions", json=LONG, headers=probe.auth, timeout=probe.timeout))))
    for t in threads:
        t.start()
    busy = wait_for(lambda: probe.metrics().get("tensorfold_active_streams", 0) >= 4 and all(streams), 20)
    served.process.send_signal(15)
    time.sleep(0.2)
    new = httpx.post(probe.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=probe.auth,
                     timeout=5)
    health = httpx.get(probe.url + "/health", timeout=5)
    new_ok = new.status_code == 503 and set(new.json().get("error", {})) == {"message", "type", "param", "code"}
    for t in threads:
        t.join(timeout=grace + 30)
    ended = []
    for lines in streams:
        final = json.loads(lines[-2][len("data: "):]) if len(lines) >= 2 and lines[-2].startswith("data: {") else {}
        errors = [line for line in lines if '"error"' in line]
        ended.append(bool(lines) and lines[-1] == "data: [DONE]" and not errors
                     and final.get("choices", [{}])[0].get("finish_reason") is not None)
    reply = plain.get("reply")
    plain_ok = reply is not None and reply.status_code == 200 and reply.json()["choices"][0]["token_sha256"]
    try:
        status = served.process.wait(timeout=grace + 20)
    except Exception:  # noqa: BLE001 (still running: that is the finding)
        status = None
    log = served.log()
    clean = "Traceback" not in log and "CancelledError" not in log
    tokens = [sum(line.startswith("data: {") for line in lines) for lines in streams]
    return [result("SIGTERM: 503 to a new request and /health while draining", new_ok and health.status_code == 503,
                   f"lanes busy: {busy is not None}; new request {new.status_code}, /health {health.status_code}",
                   started),
            result("SIGTERM: each cut stream ends with its final chunk and [DONE]", all(ended),
                   f"streams ended properly: {ended}; data chunks {tokens}", started),
            result("SIGTERM: a cut non-streaming request gets its answer so far", bool(plain_ok),
                   f"answered {reply.status_code if reply is not None else None}", started),
            result("SIGTERM: the server exits 0 within the grace, without a traceback", status == 0 and clean,
                   f"exit status {status}; traceback in the log: {not clean}", started)]
