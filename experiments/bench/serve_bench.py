"""`lockstep serve` under load (issue 63's benchmark), stdlib only so it runs on any GPU machine.

  python3 experiments/bench/serve_bench.py HOST:PORT PROMPTS.jsonl --clients 1,16,64,256 --max-tokens M
      [--identical 1000] [--sample-output FILE]

For each client count C: C threads each send streamed greedy requests for the prompts in turn
(every prompt once per level; at most 4 C prompts, so one client does not take all night),
timing the first token (TTFT) and the gaps between tokens (ITL); prints one markdown row a
level with tokens/s and the p50 / p99 of both. Every level must give each prompt the token ids
and logprobs (as written: equal text is equal bits) of `lockstep sample`'s output of the same
prompts (--sample-output, greedy), or else of the last level. --identical N:
N identical greedy requests sent at once among N random neighbours (other prompts, T = 1, seeds):
the number of unique completions (Thinking Machines' test; 1 expected). Exits 1 on a mismatch.
"""
import argparse
import http.client
import json
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


def streamed(address, prompt_ids, max_tokens):
    """(token ids, logprobs, TTFT s, inter-token gaps s) of one streamed greedy request."""
    sent = time.perf_counter()
    conn, resp = post(address, {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1, "stream": True}, True)
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ids, logprobs, arrivals = [], [], []
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise SystemExit(f"stream error: {chunk['error']}")
        for c in chunk["choices"]:
            if c["token_ids"]:
                now = time.perf_counter()
                arrivals += [now] * len(c["token_ids"])
                ids += c["token_ids"]
                logprobs += c["logprobs"]["token_logprobs"]
    conn.close()
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


def level(address, prompts, clients, max_tokens):
    results, lock, next_index = {}, threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(prompts):
                return
            results[i] = streamed(address, prompts[i], max_tokens)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - start


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def identical(address, prompts, n, max_tokens):
    rng = random.Random(20261207)
    needle = {"prompt": prompts[0], "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}
    jobs = [needle] * n + [{"prompt": rng.choice(prompts)[: rng.randrange(1, len(prompts[0]) + 1)], "max_tokens": rng.randrange(1, max_tokens + 1), "temperature": 1.0, "seed": rng.randrange(2**31)} for _ in range(n)]
    rng.shuffle(jobs)
    answers, lock, it = [], threading.Lock(), iter(jobs)

    def worker():
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            v = whole(address, job)
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
    return len(set(answers)), len(answers), time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("prompts")
    ap.add_argument("--clients", default="1,16,64,256")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--identical", type=int, default=0)
    ap.add_argument("--sample-output", default="")
    a = ap.parse_args()
    prompts = [json.loads(l)["prompt_ids"] for l in open(a.prompts)]
    ok = True
    reference = {}
    if a.sample_output:
        for line in open(a.sample_output):
            v = json.loads(line)
            reference[v["id"]] = json.dumps([v["token_ids"], v["logprobs"]])
    rows = []
    for clients in [int(c) for c in a.clients.split(",")]:
        results, wall = level(a.address, prompts[: 4 * clients], clients, a.max_tokens)
        tokens = sum(len(r[0]) for r in results.values())
        gaps = [g for r in results.values() for g in r[3]]
        ttft = [r[2] for r in results.values()]
        rows.append((clients, results, f"| {clients} | {len(results)} | {wall:.1f} | {tokens / wall:,.0f} | {pct(ttft, 0.5):.0f} / {pct(ttft, 0.99):.0f} | {pct(gaps, 0.5):.1f} / {pct(gaps, 0.99):.1f} |"))
        print(rows[-1][2], flush=True)
    reference = reference or {i: json.dumps([r[0], r[1]]) for i, r in rows[-1][1].items()}
    against = "`lockstep sample`'s" if a.sample_output else "the last level's"
    print(f"\n| clients | requests | wall s | tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | completions equal to {against} as bits |")
    print("|---|---|---|---|---|---|---|")
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
