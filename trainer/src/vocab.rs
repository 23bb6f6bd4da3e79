//! The embedded default's tokenizer: one token per character, as a real `tokenizer.json`
//! (WordLevel model, per-character split, Fuse decoder) so the same code path loads it and
//! a user's HF tokenizer.

use tokenizers::Tokenizer;

pub const EOS: &str = "<eos>";
const CHARS: &str = "0123456789+-*/=()<>:,.?! abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Characters a task's text needs beyond the base set: LaTeX's `\boxed{}` for the solutions of
/// the word problems and the long arithmetic chains. They come after the base characters, so
/// every other task keeps its ids, its vocabulary size and therefore its random model's bits.
pub fn extra_chars(task_name: &str) -> &'static str {
    if matches!(task_name, "word_problems" | "long_arithmetic") { "\\{}" } else { "" }
}

/// The tokenizer.json text: id 0 is `<eos>`, 1 is `<unk>`, then one id per character of the
/// base set followed by `extra`.
pub fn char_tokenizer_json(extra: &str) -> String {
    let mut vocab = serde_json::Map::new();
    vocab.insert(EOS.into(), 0.into());
    vocab.insert("<unk>".into(), 1.into());
    for (i, c) in CHARS.chars().chain(extra.chars()).enumerate() {
        vocab.insert(c.to_string(), (i + 2).into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 0, "content": EOS, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

pub fn char_tokenizer(extra: &str) -> Tokenizer {
    char_tokenizer_json(extra).parse().expect("the embedded tokenizer is valid")
}
