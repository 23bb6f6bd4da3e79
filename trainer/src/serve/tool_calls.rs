//! Tool calls in a model's reply, in the Hermes format Qwen's chat templates write and read
//! (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`), as OpenAI's `tool_calls`.
//! The arguments are returned as the exact text the model wrote, so the template renders an
//! echoed call back to the same characters and the session's next turn extends the sampled
//! ids (a reformatted call would be refused there).

use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(serde::Deserialize)]
struct Call<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a serde_json::value::RawValue,
}

/// The reply's content before its first call (without the newline the template puts back)
/// and its calls as OpenAI's `tool_calls` (ids `call_<prefix>_<k>`); `None` when the reply
/// holds no well-formed call, so it stays plain content.
pub fn parse(reply: &str, id_prefix: &str) -> Option<(String, Vec<Value>)> {
    let first = reply.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &reply[first..];
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let end = rest[body_start..].find(CLOSE)? + body_start;
        let call: Call = serde_json::from_str(rest[body_start..end].trim()).ok()?;
        let k = calls.len();
        calls.push(json!({"id": format!("call_{id_prefix}_{k}"), "type": "function", "function": {"name": call.name, "arguments": call.arguments.get()}}));
        rest = &rest[end + CLOSE.len()..];
    }
    Some((reply[..first].trim_end_matches('\n').to_string(), calls))
}

/// Rewrites a whole chat response's choice whose content holds calls: the content before them,
/// `message.tool_calls`, and `finish_reason` "tool_calls" where it was "stop". Returns how many
/// calls it found.
pub fn into_choice(choice: &mut Value, id_prefix: &str) -> usize {
    let Some(text) = choice["message"]["content"].as_str() else { return 0 };
    let Some((content, calls)) = parse(text, id_prefix) else { return 0 };
    choice["message"]["content"] = content.into();
    let n = calls.len();
    choice["message"]["tool_calls"] = Value::Array(calls);
    if choice["finish_reason"] == "stop" {
        choice["finish_reason"] = "tool_calls".into();
    }
    n
}

/// A streamed chat choice's text split as [`parse`] splits the whole reply: content streams
/// until a `<tool_call>` begins (text that may be the start of one, or the newlines before it,
/// held back), then the rest is held to the end, where it becomes `tool_calls` if the whole
/// reply parses, else content. So a stream's joined content and calls are the whole response's.
#[derive(Default)]
pub struct StreamSplit {
    /// Everything pushed so far: the whole reply at the end.
    reply: String,
    /// Bytes of `reply` already sent as content.
    sent: usize,
    /// A `<tool_call>` has begun: nothing more streams until the end.
    calling: bool,
}

/// What a push lets out.
#[derive(Debug, Default, PartialEq)]
pub struct Released {
    pub content: String,
    /// The reply's calls, at the end only.
    pub calls: Vec<Value>,
}

impl StreamSplit {
    /// Adds `text`; at the `end` of the choice releases the rest (`id_prefix` names the calls).
    pub fn push(&mut self, text: &str, end: bool, id_prefix: &str) -> Released {
        self.reply.push_str(text);
        if end {
            return match parse(&self.reply, id_prefix) {
                Some((content, calls)) => Released { content: content.get(self.sent.min(content.len())..).unwrap_or_default().to_string(), calls },
                None => Released { content: self.reply[self.sent..].to_string(), calls: Vec::new() },
            };
        }
        if self.calling {
            return Released::default();
        }
        let unsent = &self.reply[self.sent..];
        let keep = match unsent.find(OPEN) {
            Some(at) => {
                self.calling = true;
                at
            }
            // hold a tail that may begin a call: newlines, then a prefix of `<tool_call>`
            None => {
                let partial = (1..OPEN.len()).rev().find(|&k| unsent.ends_with(&OPEN[..k])).unwrap_or(0);
                let before = &unsent[..unsent.len() - partial];
                before.trim_end_matches('\n').len()
            }
        };
        // before a call the newlines the template puts back are not content
        let keep = if self.calling { unsent[..keep].trim_end_matches('\n').len() } else { keep };
        let content = unsent[..keep].to_string();
        self.sent += keep;
        Released { content, calls: Vec::new() }
    }
}

/// The `tool_calls` of a stream's delta: each call with its index among the choice's calls.
pub fn delta_calls(calls: Vec<Value>) -> Value {
    Value::Array(calls.into_iter().enumerate().map(|(index, mut call)| {
        call["index"] = index.into();
        call
    }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_parse_with_their_arguments_as_written_and_malformed_ones_stay_content() {
        let reply = "Let me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"b\": 2, \"a\": \"3*4\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"done\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(reply, "7_1").unwrap();
        assert_eq!(content, "Let me compute.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["function"]["arguments"], "{\"b\": 2, \"a\": \"3*4\"}", "the model's key order and spacing");
        assert_eq!(calls[1]["id"], "call_7_1_1");
        assert!(parse("no calls here", "x").is_none());
        assert!(parse("<tool_call>{\"name\": \"calc\"", "x").is_none(), "unclosed");
        assert!(parse("<tool_call>not json</tool_call>", "x").is_none());
        // a whole response's choice rewritten in place
        let mut choice = json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}});
        assert_eq!(into_choice(&mut choice, "c"), 2);
        assert_eq!((choice["finish_reason"].as_str(), choice["message"]["content"].as_str()), (Some("tool_calls"), Some("Let me compute.")));
        let mut plain = json!({"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "no calls"}});
        assert_eq!(into_choice(&mut plain, "c"), 0);
        assert!(plain["message"].get("tool_calls").is_none() && plain["finish_reason"] == "length");
    }

    /// Streamed in pieces split anywhere, a reply gives the whole response's content and calls.
    #[test]
    fn a_reply_streamed_in_any_pieces_splits_as_the_whole_reply_parses() {
        let replies = [
            "Let me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"done\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"calc\", \"arguments\": {}}\n</tool_call>",
            "no calls, but a < sign and <tool at the end <tool",
            "text\n\n",
            "broken <tool_call>{\"name\": 1}</tool_call> stays content",
            "unclosed\n<tool_call>{\"name\": \"calc\"",
            "",
        ];
        for reply in replies {
            let whole = parse(reply, "p");
            let (want_content, want_calls) = whole.clone().unwrap_or((reply.to_string(), Vec::new()));
            let cuts: Vec<usize> = (0..=reply.len()).filter(|&i| reply.is_char_boundary(i)).collect();
            // every two-piece split and one-character pieces
            let mut splits: Vec<Vec<&str>> = cuts.iter().map(|&i| vec![&reply[..i], &reply[i..]]).collect();
            splits.push(cuts.windows(2).map(|w| &reply[w[0]..w[1]]).collect());
            for pieces in splits {
                let mut split = StreamSplit::default();
                let (mut content, mut calls) = (String::new(), Vec::new());
                for (k, piece) in pieces.iter().enumerate() {
                    let out = split.push(piece, k + 1 == pieces.len(), "p");
                    assert!(out.calls.is_empty() || k + 1 == pieces.len(), "calls before the end");
                    content += &out.content;
                    calls.extend(out.calls);
                }
                if pieces.is_empty() {
                    let out = split.push("", true, "p");
                    content += &out.content;
                    calls.extend(out.calls);
                }
                assert_eq!((&content, &calls), (&want_content, &want_calls), "{reply:?} in {pieces:?}");
            }
        }
        let numbered = delta_calls(vec![json!({"id": "a"}), json!({"id": "b"})]);
        assert_eq!((numbered[0]["index"].as_u64(), numbered[1]["index"].as_u64()), (Some(0), Some(1)));
    }

    /// Qwen3's template renders a parsed reply, echoed back, to the very text the model wrote.
    #[test]
    fn an_echoed_call_renders_back_to_the_sampled_text_with_qwen3s_template() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates/qwen3.jinja");
        let template = crate::chat::ChatTemplate::new("qwen3.jinja", std::fs::read_to_string(path).unwrap(), None, Some("<|im_end|>".into())).unwrap();
        let user = json!({"role": "user", "content": "What is 12*34?"});
        let prompt = template.render(&json!([user]), true, &Default::default()).unwrap();
        for sampled in ["<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call>", "I will call it.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call>"] {
            let (content, calls) = parse(sampled, "0_0").unwrap();
            let echoed = json!([user, {"role": "assistant", "content": content, "tool_calls": calls}, {"role": "tool", "content": "408"}]);
            let next = template.render(&echoed, true, &Default::default()).unwrap();
            let want = format!("{prompt}{sampled}<|im_end|>");
            assert!(next.starts_with(&want), "{next:?}\ndoes not begin with\n{want:?}");
        }
    }
}
