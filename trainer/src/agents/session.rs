//! One episode's exact trajectory: every turn's prompt ids (as the sampler was given them) and
//! the ids and logprobs it sampled. A turn's prompt is built from the earlier turns' ids, never
//! from re-tokenised text: the session keeps what the model saw and sampled, and only the text
//! the chat template adds after the last sampled token (tool results, the next user message,
//! the template's own markers) is tokenised anew.
//!
//! The rule, for a turn whose messages render to text `T` (docs/agents.md): with `P` the last
//! turn's rendered prompt and `S` the text of its sampled ids (special tokens kept), `T` must
//! begin with `P + S`; the prompt ids are then the last prompt's ids, the sampled ids, and the
//! rest of `T` tokenised. Else `T` may begin with `P` + the text returned to the client + the
//! text of the stop token that ended the turn (if one did): the reply as the client saw it,
//! whose hidden parts (special tokens inside it, a stop string's text) stay in the context as
//! they were sampled. Anything else (a template that rewrites history, as Qwen3's drops earlier
//! `<think>` blocks, or a client that edited the reply) is refused, naming the first character
//! that differs: never a trajectory whose sampled tokens are not the ones in its context.

/// One model turn: what the sampler was given and what it drew.
#[derive(Clone, Debug)]
pub struct Turn {
    pub prompt: Vec<u32>,
    /// The rendered text the prompt ids stand for.
    pub prompt_text: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// A mixture-of-experts model's routing digest per sampled id (`sampler::Completion::routing`).
    pub routing: Vec<u64>,
    /// The sampled ids' text with special tokens kept (the end-of-turn token's text included).
    pub sampled_text: String,
    /// The text returned to the client (special tokens dropped, cut at a stop string).
    pub reply_text: String,
    /// The text of the stop token that ended the turn ("" when none did).
    pub end_text: String,
    pub tool_calls: usize,
}

#[derive(Default, Debug)]
pub struct Session {
    pub turns: Vec<Turn>,
    /// The first request this session refused, as said to the client: the episode fails with it.
    pub refused: Option<String>,
    /// A request is being generated (one at a time per session).
    pub busy: bool,
}

impl Session {
    /// The prompt ids of a turn whose messages render to `text` (the module's rule);
    /// `encode` tokenises the text after the earlier turns. An error says where `text`
    /// stops extending the session.
    pub fn next_prompt(&self, text: &str, encode: &dyn Fn(&str) -> Result<Vec<u32>, String>) -> Result<Vec<u32>, String> {
        let Some(last) = self.turns.last() else { return encode(text) };
        let kept = |rest: &str| -> Result<Vec<u32>, String> { Ok([last.prompt.as_slice(), &last.tokens, &encode(rest)?].concat()) };
        let full = format!("{}{}", last.prompt_text, last.sampled_text);
        if let Some(rest) = text.strip_prefix(full.as_str()) {
            return kept(rest);
        }
        if let Some(rest) = text.strip_prefix(format!("{}{}{}", last.prompt_text, last.reply_text, last.end_text).as_str()) {
            return kept(rest);
        }
        let at = text.chars().zip(full.chars()).take_while(|(a, b)| a == b).count();
        let snippet = |s: &str| s.chars().skip(at.saturating_sub(20)).take(60).collect::<String>();
        let whose = if at < last.prompt_text.chars().count() { "an earlier message (the chat template rewrote history, e.g. Qwen3 drops earlier <think> blocks; render with a template that keeps it, or start a new session)" } else { "the model's last reply (it must be sent back as returned)" };
        Err(format!(
            "turn {} does not extend the session's earlier tokens: at character {at} the conversation renders as {:?} where the session holds {:?}, in {whose}",
            self.turns.len(),
            snippet(text),
            snippet(&full)
        ))
    }

    /// The episode as one training sequence: the last turn's prompt and sampled ids, and each
    /// sampled token's row in its logprobs (row r scores token r + 1), the turns' ids and
    /// logprobs in order.
    pub fn trajectory(&self) -> Option<Trajectory> {
        let last = self.turns.last()?;
        let sequence = [last.prompt.as_slice(), &last.tokens].concat();
        let (mut positions, mut tokens, mut logprobs, mut routing) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for turn in &self.turns {
            positions.extend((0..turn.tokens.len()).map(|t| turn.prompt.len() + t - 1));
            tokens.extend_from_slice(&turn.tokens);
            logprobs.extend_from_slice(&turn.logprobs);
            routing.extend_from_slice(&turn.routing);
        }
        // every turn's or none (a dense model's turns carry none)
        if routing.len() != tokens.len() {
            routing.clear();
        }
        Some(Trajectory { first_prompt: self.turns[0].prompt.clone(), sequence, positions, tokens, logprobs, routing })
    }
}

/// An episode's training data (see [`Session::trajectory`]).
pub struct Trajectory {
    pub first_prompt: Vec<u32>,
    pub sequence: Vec<u32>,
    pub positions: Vec<usize>,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Each sampled id's routing digest (a mixture-of-experts model), else empty.
    pub routing: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(s: &str) -> Result<Vec<u32>, String> {
        Ok(s.chars().map(|c| c as u32).collect())
    }

    /// A turn that sampled `sampled` (a final `$` is the stop token) and returned `reply`.
    fn turn(prompt: &str, sampled: &str, reply: &str, session: &Session) -> Turn {
        let ids = session.next_prompt(prompt, &chars).unwrap();
        let tokens = chars(sampled).unwrap();
        let end_text = if sampled.ends_with('$') { "$" } else { "" };
        Turn { prompt: ids, prompt_text: prompt.into(), logprobs: tokens.iter().map(|&t| -(t as f32) / 100.0).collect(), tokens, sampled_text: sampled.into(), reply_text: reply.into(), end_text: end_text.into(), tool_calls: 0, routing: Vec::new() }
    }

    #[test]
    fn each_turn_extends_the_sampled_ids_and_only_the_new_text_is_tokenised() {
        let mut s = Session::default();
        let t0 = turn("Q:2*3.A:", "calc(2*3)$", "calc(2*3)", &s);
        s.turns.push(t0);
        // the client's echo renders the reply, then the tool's result and the next opening
        let next = "Q:2*3.A:calc(2*3)$R:6.A:";
        // a tokeniser that would re-split the earlier text differently is never asked to
        let encode_new_only = |text: &str| -> Result<Vec<u32>, String> {
            assert_eq!(text, "R:6.A:", "only the text after the sampled ids is tokenised");
            chars(text)
        };
        let ids = s.next_prompt(next, &encode_new_only).unwrap();
        assert_eq!(ids, chars(next).unwrap());
        let t1 = Turn { prompt: ids, prompt_text: next.into(), tokens: chars("answer 6$").unwrap(), logprobs: vec![-0.5; 9], sampled_text: "answer 6$".into(), reply_text: "answer 6".into(), end_text: "$".into(), tool_calls: 0, routing: Vec::new() };
        s.turns.push(t1);
        let tr = s.trajectory().unwrap();
        assert_eq!(tr.sequence, chars("Q:2*3.A:calc(2*3)$R:6.A:answer 6$").unwrap());
        // the rows scoring the sampled tokens: "calc(2*3)$" after 8 prompt chars, "answer 6$" after 24
        let want: Vec<usize> = (7..17).chain(23..32).collect();
        assert_eq!(tr.positions, want);
        for (&row, &t) in tr.positions.iter().zip(&tr.tokens) {
            assert_eq!(tr.sequence[row + 1], t, "row {row} scores the sampled token");
        }
        assert_eq!(tr.logprobs.len(), tr.tokens.len());
        assert!(tr.routing.is_empty(), "a dense model's turns carry no routing");
        // a mixture-of-experts model's turns: their routing digests in the tokens' order
        for (k, turn) in s.turns.iter_mut().enumerate() {
            turn.routing = (0..turn.tokens.len() as u64).map(|t| 1000 * k as u64 + t).collect();
        }
        let tr = s.trajectory().unwrap();
        assert_eq!(tr.routing, (0..10).chain(1000..1009).collect::<Vec<u64>>());
        // a turn without them: none at all, so no digest sits against another token
        s.turns[1].routing.clear();
        assert!(s.trajectory().unwrap().routing.is_empty());
    }

    #[test]
    fn a_rewritten_history_or_an_edited_reply_is_refused_where_it_differs() {
        let mut s = Session::default();
        let t0 = turn("U:hi.A:", "<think>x</think>ok$", "<think>x</think>ok", &s);
        s.turns.push(t0);
        // the template dropped the earlier <think> block
        let err = s.next_prompt("U:hi.A:ok$U:more.A:", &chars).unwrap_err();
        assert!(err.contains("turn 1") && err.contains("character 7") && err.contains("last reply"), "{err}");
        let err = s.next_prompt("U:HI.A:<think>x</think>ok$", &chars).unwrap_err();
        assert!(err.contains("character 2") && err.contains("earlier message"), "{err}");
    }

    #[test]
    fn hidden_parts_of_a_reply_stay_in_the_context_as_sampled() {
        // a stop string: sampled "calc(1)</call>", the client got "calc(1)", the template closes with "$"
        let mut s = Session::default();
        let t0 = turn("A:", "calc(1)</call>", "calc(1)", &s);
        s.turns.push(t0);
        let ids = s.next_prompt("A:calc(1)$R:1.A:", &chars).unwrap();
        assert_eq!(ids, chars("A:calc(1)</call>$R:1.A:").unwrap(), "the sampled stop text stays in the context");
        assert!(s.next_prompt("A:calc(2)$R:1.A:", &chars).unwrap_err().contains("last reply"), "an edited reply");
        // a special token inside the reply ("#", dropped from the text returned), then the stop token "$"
        let mut s = Session::default();
        let t0 = turn("A:", "ab#cd$", "abcd", &s);
        s.turns.push(t0);
        let ids = s.next_prompt("A:abcd$R:x.A:", &chars).unwrap();
        assert_eq!(ids, chars("A:ab#cd$R:x.A:").unwrap(), "one stop token, the special token kept");
    }
}
