"""`top_logprobs` of a running `lockstep serve` on the GPU: each greedy token is its list's first
with the same logprob bits, a seeded T = 1 token's entry (where listed) is its logprob's bits, and
the same request among random neighbours gives the same lists. Prints one line a check.
    python3 experiments/bench/serve_top_check.py HOST:PORT VOCAB [COPIES]"""
import concurrent.futures as cf
import json
import random
import sys
import urllib.request

address, vocab = sys.argv[1], int(sys.argv[2])
copies = int(sys.argv[3]) if len(sys.argv) > 3 else 32


def complete(body):
    req = urllib.request.Request(f"http://{address}/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)["choices"][0]


rng = random.Random(7)
prompt = [rng.randrange(300, vocab - 3) for _ in range(32)]
for name, extra in [("greedy", {"temperature": 0}), ("T 1, seed 5", {"temperature": 1.0, "seed": 5})]:
    body = {"prompt": prompt, "max_tokens": 32, "logprobs": 5, **extra}
    alone = complete(body)
    ids, lp, top = alone["token_ids"], alone["logprobs"]["token_logprobs"], alone["logprobs"]["top_token_ids"]
    first = sum(1 for i in range(len(ids)) if top[i][0][0] == ids[i] and top[i][0][1] == lp[i])
    listed = [i for i in range(len(ids)) if any(e[0] == ids[i] for e in top[i])]
    same_bits = sum(1 for i in listed if next(e[1] for e in top[i] if e[0] == ids[i]) == lp[i])
    ordered = all(all(a[1] >= b[1] for a, b in zip(t, t[1:])) for t in top)
    neighbours = [{"prompt": [rng.randrange(300, vocab - 3) for _ in range(rng.randrange(4, 64))], "max_tokens": rng.randrange(4, 48), "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randrange(1 << 30), "logprobs": rng.choice([0, 3, 20])} for _ in range(copies)]
    with cf.ThreadPoolExecutor(2 * copies) as pool:
        jobs = [pool.submit(complete, body) for _ in range(copies)] + [pool.submit(complete, n) for n in neighbours]
        loaded = [j.result() for j in jobs[:copies]]
    unique = len({json.dumps(c["logprobs"], sort_keys=True) for c in loaded} | {json.dumps(alone["logprobs"], sort_keys=True)})
    print(f"{name}: {len(ids)} tokens; the token first in its list with equal logprob {first}/{len(ids)}; listed {len(listed)}, equal bits {same_bits}/{len(listed)}; best first {ordered}; "
          f"{copies} copies among {copies} neighbours: {unique} unique logprobs object(s)")
