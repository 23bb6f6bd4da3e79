"""Random-weight Hugging Face checkpoints of real model shapes, for scale runs without a download.

Run where torch, transformers and tokenizers are installed (the H200 machine has them):
    python3 experiments/make_real_shape.py SHAPE OUT_DIR [--dtype bf16]
SHAPE: qwen3-0.6b, qwen3-1.7b, qwen3-4b or qwen3-8b (the published configs' shapes: layers,
hidden, heads, head_dim, intermediate, vocab 151936, tied embeddings for 0.6B-4B); qwen2.5-1.5b
and qwen2.5-7b (Qwen2: q/k/v biases, drawn N(0, 0.5) since transformers zeroes them); llama-3.2-1b
and llama-3.1-8b (Llama 3.1's `llama3` RoPE scaling, vocab 128256, head_dim 64 for 1B).
Writes OUT_DIR/{config.json, model.safetensors (shards + index when large), tokenizer.json}
and OUT_DIR/task.jsonl (40-digit prompts whose answer is their reverse; any answer scores 0 on a
random model, which is fine: scale runs measure bits, memory and time, not learning).

The weights come from transformers' own initialiser (`Qwen3ForCausalLM(config)` on the GPU,
std 0.02), with the norms set to 1 + 0.2 N(0,1) so that they are not all ones. The tokenizer is
a byte-level BPE with no merges whose vocabulary fills all 151936 ids (256 byte symbols, the
three Qwen specials, then three-symbol filler tokens), so every id the sampler draws decodes.
"""
import argparse
import json
import os
import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

SHAPES = {
    # family, layers, hidden, heads, kv heads, head_dim, intermediate, tied, vocab
    "qwen3-0.6b": ("qwen3", 28, 1024, 16, 8, 128, 3072, True, 151936),
    "qwen3-1.7b": ("qwen3", 28, 2048, 16, 8, 128, 6144, True, 151936),
    "qwen3-4b": ("qwen3", 36, 2560, 32, 8, 128, 9728, True, 151936),
    "qwen3-8b": ("qwen3", 36, 4096, 32, 8, 128, 12288, False, 151936),
    "qwen2.5-1.5b": ("qwen2", 28, 1536, 12, 2, 128, 8960, True, 151936),
    "qwen2.5-7b": ("qwen2", 28, 3584, 28, 4, 128, 18944, False, 152064),
    "llama-3.2-1b": ("llama", 16, 2048, 32, 8, 64, 8192, True, 128256),
    "llama-3.1-8b": ("llama", 32, 4096, 32, 8, 128, 14336, False, 128256),
}

ap = argparse.ArgumentParser()
ap.add_argument("shape", choices=sorted(SHAPES))
ap.add_argument("out")
ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
ap.add_argument("--seed", type=int, default=20261201)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
family, layers, hidden, heads, kv, head_dim, inter, tied, VOCAB = SHAPES[args.shape]

alphabet = pre_tokenizers.ByteLevel.alphabet()
alphabet.sort()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
vocab = {s: i for i, s in enumerate(alphabet)}
letters = [c for c in alphabet if c.isalpha()][:60]
filler = (a + b + c for a in letters for b in letters for c in letters)
while len(vocab) < VOCAB - len(specials):
    t = next(filler)
    if t not in vocab:
        vocab[t] = len(vocab)
for s in specials:
    vocab[s] = len(vocab)
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(specials)
tok.save(os.path.join(args.out, "tokenizer.json"))
assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()

shape = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
             tie_word_embeddings=tied, bos_token_id=None, eos_token_id=vocab["<|endoftext|>"])
if family == "qwen3":
    config_cls, model_cls = Qwen3Config, Qwen3ForCausalLM
    cfg = config_cls(**shape, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0)
elif family == "qwen2":
    config_cls, model_cls = Qwen2Config, Qwen2ForCausalLM
    cfg = config_cls(**shape, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False)
else:
    config_cls, model_cls = LlamaConfig, LlamaForCausalLM
    cfg = config_cls(**shape, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 32.0 if args.shape == "llama-3.2-1b" else 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
torch.manual_seed(args.seed)
dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = model_cls(cfg).to(dtype)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif name.endswith(".bias"):
            p.copy_(0.5 * torch.randn_like(p))
model.save_pretrained(args.out, safe_serialization=True, max_shard_size="5GB")
gen = os.path.join(args.out, "generation_config.json")
if os.path.exists(gen):
    os.remove(gen)

rng = random.Random(args.seed)
with open(os.path.join(args.out, "task.jsonl"), "w") as f:
    for _ in range(4096):
        digits = "".join(rng.choice("0123456789") for _ in range(40))
        f.write(json.dumps({"prompt": f"reverse {digits}:", "answer": digits[::-1]}) + "\n")
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"shape": args.shape, "out": args.out, "parameters": params, "dtype": args.dtype,
                  "files": sorted(os.listdir(args.out))}))
