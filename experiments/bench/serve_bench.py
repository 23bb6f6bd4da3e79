"""`lockstep serve` under load (issue 63's benchmark), stdlib only so it runs on any GPU machine.

  python3 experiments/bench/serve_bench.py HOST:PORT PROMPTS.jsonl --clients 1,16,64,256 --max-tokens M
      [--identical 1000] [--sample-output FILE]

For each client count C: C threads each send streamed greedy requests for the prompts in turn
(every prompt once per level; at most 4 C prompts, so one client does not take all night),
timing the first token (TTFT) and the gaps between tokens (ITL): a client only reads and time-stamps
the stream's lines, which are parsed after the level (JSON parsing in the clients' interpreters
delayed their next requests); prints one markdown row a
level with tokens/s and the p50 / p99 of both. Every level must give each prompt the token ids
and logprobs (as written: equal text is equal bits) of `lockstep sample`'s output of the same
prompts (--sample-output, greedy), or else of the last level. --identical N:
N identical greedy requests sent at once among N random neighbours (other prompts, T = 1, seeds):
the number of unique completions (Thinking Machines' test; 1 expected). Exits 1 on a mismatch.
--whole: each level's requests answered whole (no stream; TTFT is then the whole answer's time
and ITL is not measured), to tell the SSE path's cost from the engine's. --processes P: each
level's clients spread over P processes (threads within each), so the clients' own parsing is
not one interpreter's; a list (8,16) runs each level once per count. The clients' threads switch
the GIL every 0.5 ms (Python's default is 5 ms, a wait a finished client's next request would
add). Each timed level scrapes the server's /metrics before and after: the engine's steps and
sampled tokens give its tokens a step (how full the batch was: the clients' turnaround between
requests empties it) and ms a step (the wall time over the steps), printed beside `lockstep
sample`'s (--sample-rates C=TPS:TOKENS_PER_STEP:MS_PER_STEP), so a gap shows where it is. Requests ask `"logprobs": 0`: the sampled token's logprob, no alternatives.
--warmup: before each timed level, the same level runs untimed on the next 4 C prompts, so the
timed one finds the kernels compiled and the step graphs captured (as `lockstep sample`'s
steady rate does). --sample-rates C=TPS,...: `lockstep sample`'s tokens/s with
sampler.max_batch = C on the same prompts, printed beside each level with the ratio.
"""
import argparse
import http.client
import json
import multiprocessing
import random
import statistics
import sys
import threading
import time


def post(address, body, stream):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=3600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def answered(address, prompt_ids, max_tokens):
    """(token ids, logprobs, whole-answer s, no gaps) of one whole greedy request."""
    sent = time.perf_counter()
    c = whole(address, {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0})["choices"][0]
    return c["token_ids"], c["logprobs"]["token_logprobs"], time.perf_counter() - sent, []


def streamed(address, prompt_ids, max_tokens):
    """(send time, [(arrival time, SSE data line)]) of one streamed greedy request: the lines are
    parsed by `parsed` after the level, so the clients only read while the server streams."""
    sent = time.perf_counter()
    conn, resp = post(address, {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0, "stream": True}, True)
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    lines = [(time.perf_counter(), line) for line in resp if line.startswith(b"data: ")]
    conn.close()
    return sent, lines


def parsed(raw):
    """(token ids, logprobs, TTFT s, inter-token gaps s) of a `streamed` answer; a whole answer as is."""
    if len(raw) == 4:
        return raw
    sent, lines = raw
    ids, logprobs, arrivals = [], [], []
    for now, line in lines:
        line = line.strip()
        if line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise SystemExit(f"stream error: {chunk['error']}")
        for c in chunk["choices"]:
            if c["token_ids"]:
                arrivals += [now] * len(c["token_ids"])
                ids += c["token_ids"]
                logprobs += c["logprobs"]["token_logprobs"]
    ttft = arrivals[0] - sent if arrivals else float("nan")
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if b > a]
    return ids, logprobs, ttft, gaps


def whole(address, body):
    conn, resp = post(address, body, False)
    v = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {v}")
    return v


def threads_run(args):
    """`clients` threads sending `prompts` (index -> ids) in turn; their results by index."""
    address, prompts, clients, max_tokens, whole_answers, start_at = args
    sys.setswitchinterval(0.0005)
    one = answered if whole_answers else streamed
    while time.time() < start_at:  # every process starts its clients at the same moment
        time.sleep(0.001)
    results, errors, lock, queue = {}, [], threading.Lock(), list(prompts.items())

    def worker():
        while True:
            with lock:
                if not queue or errors:
                    return
                i, ids = queue.pop(0)
            try:
                r = one(address, ids, max_tokens)
            except BaseException as e:  # SystemExit too: a thread would drop it silently
                with lock:
                    errors.append(f"prompt {i}: {e}")
                return
            with lock:
                results[i] = r

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} request(s) failed; the first: {errors[0]}")
    return results


def level(address, prompts, clients, max_tokens, whole_answers=False, processes=1):
    processes = max(1, min(processes, clients))
    start_at = time.time() + (1.0 if processes > 1 else 0.0)
    shares = [({i: p for i, p in enumerate(prompts) if i % processes == k}, clients // processes + (k < clients % processes)) for k in range(processes)]
    jobs = [(address, share, n, max_tokens, whole_answers, start_at) for share, n in shares]
    start = time.perf_counter() + (start_at - time.time())
    if processes == 1:
        parts = [threads_run(jobs[0])]
    else:
        with multiprocessing.Pool(processes) as pool:
            parts = pool.map(threads_run, jobs)
    wall = time.perf_counter() - start
    return {i: parsed(r) for part in parts for i, r in part.items()}, wall


def engine_counters(address):
    """The engine's counters so far, from the server's /metrics: steps, sampled tokens, and the
    engine thread's seconds enqueueing launches, waiting for the device and between steps."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = dict(line.split()[:2] for line in text.splitlines() if line and not line.startswith("#"))
    names = ("engine_steps_total", "generation_tokens_total", "engine_launch_seconds_total", "engine_wait_seconds_total", "engine_between_steps_seconds_total", "engine_replayed_steps_total")
    return [float(values.get(f"lockstep:{n}", "nan")) for n in names]


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def identical(address, prompts, n, max_tokens):
    rng = random.Random(20261207)
    needle = {"prompt": prompts[0], "max_tokens": max_tokens, "temperature": 0, "logprobs": 0}
    jobs = [needle] * n + [{"prompt": rng.choice(prompts)[: rng.randrange(1, len(prompts[0]) + 1)], "max_tokens": rng.randrange(1, max_tokens + 1), "temperature": 1.0, "seed": rng.randrange(2**31)} for _ in range(n)]
    rng.shuffle(jobs)
    answers, failures, lock, it = [], [], threading.Lock(), iter(jobs)

    def worker():
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            try:
                v = whole(address, job)
            except BaseException as e:  # SystemExit too: a thread would drop it silently
                with lock:
                    failures.append(str(e))
                return
            if job is needle:
                c = v["choices"][0]
                with lock:
                    answers.append(json.dumps([c["token_ids"], c["logprobs"]["token_logprobs"]]))

    threads = [threading.Thread(target=worker) for _ in range(256)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"{len(failures)} of the identical test's requests failed; the first: {failures[0]}")
    return len(set(answers)), len(answers), time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("prompts")
    ap.add_argument("--clients", default="1,16,64,256")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--identical", type=int, default=0)
    ap.add_argument("--sample-output", default="")
    ap.add_argument("--whole", action="store_true")
    ap.add_argument("--processes", default="1")
    ap.add_argument("--warmup", action="store_true")
    ap.add_argument("--sample-rates", default="")
    a = ap.parse_args()
    rates = {}
    for kv in filter(None, a.sample_rates.split(",")):
        c, v = kv.split("=")
        rates[int(c)] = [float(x) for x in v.split(":")] + [float("nan")] * 5
    prompts = [json.loads(l)["prompt_ids"] for l in open(a.prompts)]
    ok = True
    reference = {}
    if a.sample_output:
        for line in open(a.sample_output):
            v = json.loads(line)
            reference[v["id"]] = json.dumps([v["token_ids"], v["logprobs"]])
    rows = []
    process_counts = [int(p) for p in a.processes.split(",")]
    for clients in [int(c) for c in a.clients.split(",")]:
        if a.warmup:
            if len(prompts) < 8 * clients:
                raise SystemExit(f"--warmup at {clients} clients needs {8 * clients} prompts, {a.prompts} has {len(prompts)}")
            level(a.address, prompts[4 * clients : 8 * clients], clients, a.max_tokens, a.whole, process_counts[0])
        for processes in process_counts:
            before = engine_counters(a.address)
            results, wall = level(a.address, prompts[: 4 * clients], clients, a.max_tokens, a.whole, processes)
            steps, sampled, launch_s, wait_s, between_s, replayed = [x - y for x, y in zip(engine_counters(a.address), before)]
            steps = max(1, steps)
            tokens = sum(len(r[0]) for r in results.values())
            gaps = [g for r in results.values() for g in r[3]]
            ttft = [r[2] for r in results.values()]
            rate, sample_per_step, sample_ms, sample_launch, sample_wait, sample_replayed = rates.get(clients, [None] + [float("nan")] * 5)[:6]
            against_sample = f" {rate:,.0f} | {tokens / wall / rate:.2f} |" if rate else " - | - |"
            per_step = f" {sampled / steps:.1f} / {sample_per_step:.1f} | {wall * 1000 / steps:.2f} / {sample_ms:.2f} |"
            # the engine thread's ms a step: enqueueing launches, waiting for the device, between steps
            host = f" {launch_s * 1000 / steps:.2f}, {wait_s * 1000 / steps:.2f}, {between_s * 1000 / steps:.2f} / {sample_launch:.2f}, {sample_wait:.2f} | {replayed / steps:.2f} / {sample_replayed:.2f} |"
            rows.append((clients, results, f"| {clients} | {processes} | {len(results)} | {wall:.2f} | {tokens / wall:,.0f} |{against_sample}{per_step}{host} {pct(ttft, 0.5):.0f} / {pct(ttft, 0.99):.0f} | {pct(gaps, 0.5):.1f} / {pct(gaps, 0.99):.1f} |"))
            print(rows[-1][2], flush=True)
    reference = reference or {i: json.dumps([r[0], r[1]]) for i, r in rows[-1][1].items()}
    against = "`lockstep sample`'s" if a.sample_output else "the last level's"
    print(f"\n| clients | client processes | requests | wall s | tokens/s | `lockstep sample` tokens/s (max_batch = clients) | serve / sample | tokens a step: serve / sample | ms a step: serve / sample | engine thread's ms a step, launch, wait, between steps: serve / sample | steps replayed as graphs: serve / sample | TTFT p50 / p99 ms | ITL p50 / p99 ms | completions equal to {against} as bits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for clients, results, row in rows:
        same = sum(json.dumps([r[0], r[1]]) == reference.get(i) for i, r in results.items())
        ok &= same == len(results)
        print(f"{row} {same} / {len(results)} |")
    if a.identical:
        unique, count, wall = identical(a.address, prompts, a.identical, a.max_tokens)
        ok &= unique == 1
        print(f"\n{count} identical greedy requests among {a.identical} random neighbours (256 clients, {wall:.1f} s): {unique} unique completion(s)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
