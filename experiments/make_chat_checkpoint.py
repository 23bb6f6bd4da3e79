#!/usr/bin/env python3
"""Turns a make_real_shape.py checkpoint into a chat checkpoint as HF ships one: links the
weights, config and tokenizer.json, and writes tokenizer_config.json with Qwen3's chat template
(the CI fixture trainer/tests/fixtures/chat_templates/qwen3.jinja), `eos_token` <|im_end|>, and
generation_config.json's `eos_token_id` (<|im_end|>, <|endoftext|>):

    python3 experiments/make_chat_checkpoint.py /tmp/checkpoints/qwen3-0.6b /tmp/checkpoints/qwen3-0.6b-chat
"""
import json
import os
import sys

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for name in os.listdir(src):
    if name == "config.json" or name == "tokenizer.json" or name.startswith("model.safetensors") or name.startswith("model-"):
        link = os.path.join(dst, name)
        if not os.path.exists(link):
            os.symlink(os.path.abspath(os.path.join(src, name)), link)
vocab = json.load(open(os.path.join(src, "tokenizer.json")))
ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
here = os.path.dirname(os.path.abspath(__file__))
template = open(os.path.join(here, "..", "trainer", "tests", "fixtures", "chat_templates", "qwen3.jinja")).read()
json.dump({"chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
           "model_max_length": 40960, "tokenizer_class": "Qwen2Tokenizer"}, open(os.path.join(dst, "tokenizer_config.json"), "w"), indent=1)
json.dump({"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"]}, open(os.path.join(dst, "generation_config.json"), "w"), indent=1)
print("chat checkpoint", dst, "eos ids", ids["<|im_end|>"], ids["<|endoftext|>"])
