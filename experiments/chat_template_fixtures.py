#!/usr/bin/env python3
"""Renders the committed chat templates with transformers' own renderer (the function behind
`apply_chat_template`) and writes the expected strings the CI tests compare against:

    pip install transformers jinja2   # no torch needed
    python3 experiments/chat_template_fixtures.py > trainer/tests/fixtures/chat_templates/cases.json
"""
import json
import pathlib

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = pathlib.Path(__file__).resolve().parent.parent / "trainer/tests/fixtures/chat_templates"
SPECIAL = {"qwen3": {"bos_token": None, "eos_token": "<|im_end|>"}, "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}}
CONVERSATIONS = [
    ("one user turn", [{"role": "user", "content": "What is 12 + 30?"}], {}),
    ("system and user", [{"role": "system", "content": "You are a careful grader.\n"}, {"role": "user", "content": "  Solve: 3x = 12.  "}], {}),
    ("no generation prompt", [{"role": "user", "content": "hi"}], {"add_generation_prompt": False}),
    ("thinking off", [{"role": "user", "content": "Sum 1..10"}], {"enable_thinking": False}),
    ("multi-turn with reasoning", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsmall sum\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
    ], {}),
    ("unicode and braces", [{"role": "user", "content": "Évalue {x}² — \\frac{1}{2} · 日本"}], {}),
]


def main():
    cases = []
    for template in ("qwen3", "llama3"):
        text = (HERE / f"{template}.jinja").read_text()
        for name, messages, extra in CONVERSATIONS:
            options = {"add_generation_prompt": True, **extra}
            rendered = render_jinja_template(conversations=[messages], chat_template=text, **options, **SPECIAL[template])[0][0]
            cases.append({"template": template, "name": name, "messages": messages, "options": options, "special": SPECIAL[template], "expected": rendered})
    print(json.dumps({"rendered_by": f"transformers {transformers.__version__}", "cases": cases}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
