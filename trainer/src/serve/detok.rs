//! Token ids to text as they come, one algorithm for streamed and whole responses, so a stream's
//! pieces joined are exactly the whole response's text. Incremental as text-generation-inference
//! does it: each new piece is the decode of a short window of recent tokens minus the window's
//! text before them, held while it ends in an incomplete UTF-8 sequence (U+FFFD). Stop strings
//! (OpenAI's `stop`) cut the text where the first one begins; while the completion runs, the
//! last bytes that could begin one are held back.

use tokenizers::Tokenizer;

pub struct Detokenizer<'a> {
    tokenizer: &'a Tokenizer,
    tokens: Vec<u32>,
    /// Start of the window decoded for context, and where its already-read part ends.
    prefix_offset: usize,
    read_offset: usize,
    /// The text so far (whole pieces only).
    text: String,
    /// Bytes of the visible text already handed out.
    emitted: usize,
    stop: &'a [String],
}

impl<'a> Detokenizer<'a> {
    pub fn new(tokenizer: &'a Tokenizer, stop: &'a [String]) -> Self {
        Detokenizer { tokenizer, tokens: Vec::new(), prefix_offset: 0, read_offset: 0, text: String::new(), emitted: 0, stop }
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// Appends `tokens` and returns the text that is now certain: not part of an unfinished
    /// character, not past a stop string, not possibly the start of one (unless `finished`).
    pub fn push(&mut self, tokens: &[u32], finished: bool) -> String {
        for &t in tokens {
            self.tokens.push(t);
            let before = self.decode(&self.tokens[self.prefix_offset..self.read_offset]);
            let after = self.decode(&self.tokens[self.prefix_offset..]);
            if after.len() > before.len() && !after.ends_with('\u{FFFD}') && after.starts_with(&before) {
                self.text.push_str(&after[before.len()..]);
                self.prefix_offset = self.read_offset;
                self.read_offset = self.tokens.len();
            }
        }
        if finished && self.read_offset < self.tokens.len() {
            // whatever the last tokens decode to, replacement characters included
            let before = self.decode(&self.tokens[self.prefix_offset..self.read_offset]);
            let after = self.decode(&self.tokens[self.prefix_offset..]);
            self.text.push_str(after.strip_prefix(before.as_str()).unwrap_or(&after[before.len().min(after.len())..]));
            self.read_offset = self.tokens.len();
        }
        let visible = self.visible();
        let mut end = visible;
        if !finished {
            let hold = self.stop.iter().map(String::len).max().unwrap_or(1).saturating_sub(1);
            end = end.saturating_sub(hold).max(self.emitted);
            while !self.text.is_char_boundary(end) {
                end -= 1;
            }
        }
        let piece = self.text.get(self.emitted..end).unwrap_or_default().to_string();
        self.emitted = self.emitted.max(end);
        piece
    }

    /// Bytes of the text before the first stop string.
    fn visible(&self) -> usize {
        self.stop.iter().filter_map(|s| self.text.find(s.as_str())).min().unwrap_or(self.text.len())
    }
}

/// The whole text of a finished completion (what a stream of it joins to).
pub fn text(tokenizer: &Tokenizer, tokens: &[u32], stop: &[String]) -> String {
    Detokenizer::new(tokenizer, stop).push(tokens, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte-level BPE without merges (GPT-2's byte alphabet, as Qwen's tokenizer): a character
    /// beyond ASCII is several tokens, and a window ending inside it decodes to U+FFFD.
    fn tokenizer() -> Tokenizer {
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet().into_iter().collect();
        alphabet.sort();
        let vocab: serde_json::Map<String, serde_json::Value> = alphabet.iter().enumerate().map(|(i, c)| (c.to_string(), i.into())).collect();
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        serde_json::json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
            "model": {"type": "BPE", "vocab": vocab, "merges": []}}).to_string().parse().expect("a byte-level tokenizer")
    }

    #[test]
    fn streamed_pieces_join_to_the_whole_text_and_to_the_tokenizers_decode() {
        for (tok, sentence) in [(tokenizer(), "Hello, world! 12 + 30 = 42. Ünïcödé ✓ done 🙂"), (crate::vocab::char_tokenizer(""), "12 + 30 = 42")] {
        let ids = tok.encode(sentence, false).unwrap().get_ids().to_vec();
        let whole = text(&tok, &ids, &[]);
        assert_eq!(whole, sentence);
        assert_eq!(whole, tok.decode(&ids, true).unwrap());
        for step in [1, 2, 3, 7] {
            let mut d = Detokenizer::new(&tok, &[]);
            let mut joined = String::new();
            for (i, chunk) in ids.chunks(step).enumerate() {
                joined.push_str(&d.push(chunk, (i + 1) * step >= ids.len()));
            }
            assert_eq!(joined, whole, "pieces of {step} tokens");
        }
        }
    }

    #[test]
    fn text_stops_where_a_stop_string_begins_and_streams_never_show_its_start() {
        let tok = tokenizer();
        let ids = tok.encode("the answer is 42 END of it", false).unwrap().get_ids().to_vec();
        let stop = vec![" END".to_string(), "zzz".to_string()];
        assert_eq!(text(&tok, &ids, &stop), "the answer is 42");
        let mut d = Detokenizer::new(&tok, &stop);
        let mut joined = String::new();
        for (i, &t) in ids.iter().enumerate() {
            let piece = d.push(&[t], i + 1 == ids.len());
            joined.push_str(&piece);
            assert!("the answer is 42".starts_with(&joined), "{joined:?} shows text past the stop string's start");
        }
        assert_eq!(joined, "the answer is 42");
    }
}
