#!/usr/bin/env python3
"""The calculator example's environment program (docs/agents.md): one episode per run. It reads
its record ({"a", "b"}) on stdin, asks the model "a*b" through lockstep's episode server
($LOCKSTEP_BASE_URL, OpenAI's chat API) and plays the episode:

- a reply `calc(X*Y)` is a tool call: the calculator's result comes back as a tool message;
- a reply `answer N` ends the episode;
- anything else ends it too, unrewarded; at most --turns model turns.

Reward: 0.3 for asking the calculator the record's own product, 0.7 for answering it right.
The last stdout line is {"reward": r, "turn_rewards": [...]}. Standard library only.
"""
import json
import os
import re
import sys
import urllib.error
import urllib.request


def chat(messages, max_tokens):
    body = json.dumps({"messages": messages, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(os.environ["LOCKSTEP_BASE_URL"] + "/chat/completions", data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.load(r)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as e:
        sys.exit(f"the server refused turn {len(messages) // 2}: {e.code} {e.read().decode()}")


def main():
    turns = int(sys.argv[sys.argv.index("--turns") + 1]) if "--turns" in sys.argv else 3
    record = json.loads(sys.stdin.readline())
    a, b = record["a"], record["b"]
    messages = [{"role": "user", "content": f"{a}*{b}"}]
    turn_rewards = []
    for _ in range(turns):
        reply = chat(messages, 16)
        messages.append({"role": "assistant", "content": reply})
        call = re.fullmatch(r"calc\((\d+)\*(\d+)\)", reply)
        if call:
            x, y = int(call.group(1)), int(call.group(2))
            turn_rewards.append(0.3 if {x, y} == {a, b} and 0.3 not in turn_rewards else 0.0)
            messages.append({"role": "tool", "content": str(x * y)})
            continue
        answer = re.fullmatch(r"answer (\d+)", reply)
        turn_rewards.append(0.7 if answer and int(answer.group(1)) == a * b else 0.0)
        break
    print(json.dumps({"reward": sum(turn_rewards), "turn_rewards": turn_rewards}))


if __name__ == "__main__":
    main()
