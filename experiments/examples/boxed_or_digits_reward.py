#!/usr/bin/env python3
"""A user's reward program for `task.reward = "command"` (protocol: docs/tasks.md), made for
runs on random-weight checkpoints, whose completions are never right: 1.0 when the last
\\boxed{...} holds the ground truth, else half the share of digit characters in the completion
(partial credit, so a group's rollouts get different rewards and the update has work)."""
import json
import sys


def boxed(text):
    at = text.rfind("\\boxed{")
    if at < 0:
        return None
    depth, start = 1, at + len("\\boxed{")
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    return None


for line in sys.stdin:
    r = json.loads(line)
    c = r["completion"]
    if boxed(c) == r["answer"].strip():
        print(1.0)
    else:
        print(0.5 * sum(ch.isdigit() for ch in c) / max(len(c), 1))
