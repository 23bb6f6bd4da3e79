//! Stop strings (vLLM's `stop`): after every token, the completion's newest text is searched
//! for the request's strings on the engine's decoder. Stopping changes which tokens a request
//! has, never a bit of any token's logprob or of another request's.

use std::sync::Arc;

/// Token ids to text (the tokenizer the caller's prompts came from). `None`: not decodable.
pub type Decoder = Arc<dyn Fn(&[u32]) -> Option<String> + Send + Sync>;

/// Whether the completion `tokens` now contains one of `stop` in its text. Checked after every
/// appended token, so a match found here ends in the newest token: only a window of the latest
/// tokens is decoded: at least one more than the longest string has bytes, grown while its text
/// is not 4 bytes longer than that string (a token may decode to no text). So the string's own
/// tokens are never the whole window, whose first token decoders treat apart (SentencePiece
/// drops its leading space, a byte-level window may start mid-character).
pub fn completes_stop_string(tokens: &[u32], stop: &[String], decode: &Decoder) -> bool {
    let Some(longest) = stop.iter().map(String::len).max() else { return false };
    let mut n = (longest + 1).min(tokens.len());
    loop {
        let text = decode(&tokens[tokens.len() - n..]).unwrap_or_default();
        if text.len() >= longest + 4 || n == tokens.len() {
            return stop.iter().any(|s| text.contains(s.as_str()));
        }
        n = (2 * n).max(1).min(tokens.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One character a token ('a' + id), id 26 decodes to nothing (a special token skipped).
    fn letters() -> Decoder {
        Arc::new(|ids: &[u32]| Some(ids.iter().filter(|&&i| i < 26).map(|&i| (b'a' + i as u8) as char).collect()))
    }

    /// SentencePiece-like: token 27 is "▁" (a space), dropped when it starts the text.
    fn spaced() -> Decoder {
        Arc::new(|ids: &[u32]| {
            let text: String = ids.iter().map(|&i| if i == 27 { ' ' } else { (b'a' + i as u8) as char }).collect();
            Some(text.strip_prefix(' ').map(str::to_string).unwrap_or(text))
        })
    }

    #[test]
    fn a_string_that_starts_with_a_space_is_found_although_decoders_drop_a_first_space() {
        // "xy ab": the string " ab" is 3 bytes in 3 tokens; a window of exactly those would
        // decode to "ab"
        assert!(completes_stop_string(&[23, 24, 27, 0, 1], &[" ab".to_string()], &spaced()));
        assert!(!completes_stop_string(&[23, 24, 0, 1], &[" ab".to_string()], &spaced()));
    }

    #[test]
    fn a_string_across_tokens_and_empty_tokens_is_found_and_a_partial_one_is_not() {
        let d = letters();
        let stop = vec!["cab".to_string()];
        // "xcab" in the latest tokens, with empty-text tokens in between
        assert!(completes_stop_string(&[23, 2, 26, 26, 0, 26, 1], &stop, &d));
        assert!(!completes_stop_string(&[23, 2, 0], &stop, &d));
        // only the completion's own tokens are searched: a lone "b" is no match
        assert!(!completes_stop_string(&[1], &stop, &d));
        // the longest of several strings sets the window; any may match
        let several = vec!["zz".to_string(), "hello".to_string()];
        assert!(completes_stop_string(&[7, 4, 11, 11, 14], &several, &d));
        assert!(completes_stop_string(&[25, 25], &several, &d));
        assert!(!completes_stop_string(&[], &several, &d));
        assert!(!completes_stop_string(&[7, 4, 11, 11, 14], &[], &d));
    }
}
