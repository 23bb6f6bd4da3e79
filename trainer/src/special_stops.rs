//! `sampler.stop` strings that name special tokens. Stop strings are matched on the completion's
//! text decoded without special tokens (docs/config.md), where a special token's text never
//! appears: `stop = ["<|im_end|>"]` would silently never stop. A stop string that is exactly one
//! special token's text therefore stops at that token (as the end-of-sequence ids do), and one
//! that holds a special token's text among other characters, which could never match, is refused.

use tokenizers::Tokenizer;

/// The ids of the special tokens that `stops` name whole, or the error for the first stop string
/// that holds one among other text.
pub fn special_stop_ids(tokenizer: &Tokenizer, stops: &[String]) -> Result<Vec<u32>, String> {
    let special: Vec<(u32, String)> = tokenizer.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, t)| (id, t.content)).collect();
    let mut ids = Vec::new();
    for (i, stop) in stops.iter().enumerate() {
        if let Some((id, _)) = special.iter().find(|(_, text)| text == stop) {
            ids.push(*id);
        } else if let Some((_, text)) = special.iter().find(|(_, text)| stop.contains(text.as_str())) {
            return Err(format!("entry {i} {stop:?} holds the special token {text:?}, which the text stop strings are matched on leaves out (special tokens are skipped when decoding), so it could never match; name the token alone to stop at it"));
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_special_token_named_whole_stops_at_its_id_and_one_inside_other_text_is_refused() {
        let json = r#"{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 2, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                             {"id": 3, "content": "</think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "<|end|>": 2, "</think>": 3}, "unk_token": "a"}}"#;
        let tokenizer: Tokenizer = json.parse().unwrap();
        let stops = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(special_stop_ids(&tokenizer, &stops(&["<|end|>", "ab"])), Ok(vec![2]));
        // a non-special added token decodes as text: matched as a string, no id
        assert_eq!(special_stop_ids(&tokenizer, &stops(&["</think>"])), Ok(vec![]));
        let err = special_stop_ids(&tokenizer, &stops(&["a", "<|end|>\n"])).unwrap_err();
        assert!(err.starts_with("entry 1 \"<|end|>\\n\"") && err.contains("never match"), "{err}");
    }
}
