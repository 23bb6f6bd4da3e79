//! Chat prompts: a checkpoint's `chat_template` rendered the way transformers'
//! `apply_chat_template` renders it (Jinja with `trim_blocks` and `lstrip_blocks`, Python's
//! string methods, `raise_exception`, `tojson` as Python's `json.dumps`), with minijinja.
//! CI compares the output with transformers' on the Qwen3 and Llama 3 templates
//! (`tests/fixtures/chat_templates/`).
//!
//! `strftime_now` is left undefined on purpose: a prompt that changed with the calendar would
//! make a resumed run differ from an uninterrupted one. Templates that guard it
//! (`strftime_now is defined`, as Llama 3.x's do) then use their own fixed date.

use minijinja::{Environment, Error, ErrorKind, Value};
use std::path::Path;

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from, for errors ("model/tokenizer_config.json").
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const NAME: &str = "chat_template";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

/// The file a chat template is read from: `override_path` when given, else the checkpoint
/// folder's `chat_template.jinja` when it has one, else its `tokenizer_config.json` (whose
/// `chat_template` key holds it). The run records this file's hash (`input_files`).
pub fn template_file(dir: &Path, override_path: Option<&Path>) -> std::path::PathBuf {
    let jinja = dir.join("chat_template.jinja");
    match override_path {
        Some(path) => path.to_path_buf(),
        None if jinja.is_file() => jinja,
        None => dir.join(TOKENIZER_CONFIG),
    }
}

impl ChatTemplate {
    /// The template of the checkpoint folder `dir`: `override_path` when given, else
    /// `chat_template.jinja` (transformers' newer layout), else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of named templates: the one named "default").
    pub fn from_checkpoint(dir: &Path, override_path: Option<&Path>) -> Result<Self, String> {
        let config_path = dir.join(TOKENIZER_CONFIG);
        let config: Option<serde_json::Value> = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(serde_json::from_str(&text).map_err(|e| format!("{}: not valid JSON: {e}", config_path.display()))?),
            Err(_) => None,
        };
        let token = |key: &str| config.as_ref().and_then(|c| special_token(c.get(key)?));
        let (bos, eos) = (token("bos_token"), token("eos_token"));
        let source = template_file(dir, override_path);
        if override_path.is_some() || source != config_path {
            let text = std::fs::read_to_string(&source).map_err(|e| format!("{}: {e}", source.display()))?;
            return Self::new(&source.display().to_string(), text, bos, eos);
        }
        let Some(config) = config else {
            return Err(format!("{} has no chat template: neither chat_template.jinja nor tokenizer_config.json is there (set task.chat_template to a template file, or task.prompt_format = \"raw\")", dir.display()));
        };
        let template = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string))
                .ok_or_else(|| format!("{}: chat_template is a list without a template named \"default\"", config_path.display()))?,
            _ => return Err(format!("{} has no chat_template (set task.chat_template to a template file, or task.prompt_format = \"raw\")", config_path.display())),
        };
        Self::new(&config_path.display().to_string(), template, bos, eos)
    }

    /// Compiles `template` (`source` names it in errors).
    pub fn new(source: &str, template: String, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // a template whose loops never end would hang the run at its first prompt
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> { Err(Error::new(ErrorKind::InvalidOperation, message)) });
        env.add_filter("tojson", python_tojson);
        env.add_template_owned(NAME, template).map_err(|e| describe(source, &e))?;
        Ok(Self { env, source: source.to_string(), bos_token, eos_token })
    }

    /// The prompt text for `messages` (each `{"role", "content", ...}`), with the assistant's
    /// opening when `add_generation_prompt`; `extra` adds template variables (e.g.
    /// `enable_thinking = false`).
    pub fn render(&self, messages: &serde_json::Value, add_generation_prompt: bool, extra: &serde_json::Map<String, serde_json::Value>) -> Result<String, String> {
        let mut vars = extra.clone();
        vars.insert("messages".into(), messages.clone());
        vars.insert("add_generation_prompt".into(), add_generation_prompt.into());
        for (key, token) in [("bos_token", &self.bos_token), ("eos_token", &self.eos_token)] {
            if let Some(t) = token {
                vars.entry(key).or_insert_with(|| t.clone().into());
            }
        }
        let template = self.env.get_template(NAME).map_err(|e| describe(&self.source, &e))?;
        template.render(Value::from_serialize(&vars)).map_err(|e| describe(&self.source, &e))
    }
}

/// How a task's prompts become chat prompts: a problem's messages (or its prompt text as one
/// user message), the configured system message first when the problem has none, rendered
/// with the assistant's opening.
pub struct ChatPrompts {
    template: ChatTemplate,
    system: String,
    extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatPrompts {
    pub fn new(template: ChatTemplate, system: &str, extra: &toml::Table) -> Result<Self, String> {
        let extra = match serde_json::to_value(extra) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => return Err("task.chat_args must be a table of template variables".into()),
        };
        Ok(Self { template, system: system.to_string(), extra })
    }

    pub fn render(&self, problem: &crate::tasks::Problem) -> Result<String, String> {
        match &problem.messages {
            Some(serde_json::Value::Array(list)) => self.render_messages(list.clone()),
            _ => self.render_messages(vec![serde_json::json!({"role": "user", "content": problem.prompt})]),
        }
    }

    /// `messages` rendered, the configured system message first when they have none.
    pub fn render_messages(&self, messages: Vec<serde_json::Value>) -> Result<String, String> {
        self.render_with_tools(messages, None)
    }

    /// [`Self::render_messages`] with OpenAI's `tools` (function schemas) handed to the
    /// template as its `tools` variable, as transformers' `apply_chat_template(tools=...)` does.
    pub fn render_with_tools(&self, mut messages: Vec<serde_json::Value>, tools: Option<&serde_json::Value>) -> Result<String, String> {
        use serde_json::{json, Value as J};
        for (i, m) in messages.iter_mut().enumerate() {
            flatten_text_parts(m).map_err(|e| format!("message {i}: {e}"))?;
        }
        let has_system = messages.first().and_then(|m| m.get("role")?.as_str()) == Some("system");
        if !self.system.is_empty() && !has_system {
            messages.insert(0, json!({"role": "system", "content": self.system}));
        }
        match tools {
            Some(tools) => {
                let mut extra = self.extra.clone();
                extra.insert("tools".into(), tools.clone());
                self.template.render(&J::Array(messages), true, &extra)
            }
            None => self.template.render(&J::Array(messages), true, &self.extra),
        }
    }

    /// Whether the template writes Hermes-style `<tool_call>` blocks (Qwen's), the format whose
    /// calls the episodes' server parses into `tool_calls`.
    pub fn writes_tool_call_blocks(&self) -> bool {
        self.template.env.templates().any(|(_, t)| t.source().contains("<tool_call>"))
    }
}

/// OpenAI's content parts (`[{"type": "text", "text": ...}, ...]`) as the one string a text
/// model's template expects, the parts joined by newlines as vLLM joins them: a template that
/// tests `content is string` (Qwen3's) would otherwise drop the message's text silently.
/// A part that is not text (an image, audio) is refused: this model reads text only.
fn flatten_text_parts(message: &mut serde_json::Value) -> Result<(), String> {
    let Some(serde_json::Value::Array(parts)) = message.get("content") else { return Ok(()) };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(serde_json::Value::as_str), part.get("text").and_then(serde_json::Value::as_str)) {
            (Some("text"), Some(text)) => texts.push(text.to_string()),
            (kind, _) => return Err(format!("content part {j} is {}: this model reads text parts only ({{\"type\": \"text\", \"text\": ...}})", kind.map_or_else(|| part.to_string(), |k| format!("of type {k:?}")))),
        }
    }
    message["content"] = texts.join("\n").into();
    Ok(())
}

/// A special token as tokenizer_config.json writes it: a string or `{"content": ...}`.
fn special_token(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// A template error with the template's source and line ("template error" alone tells a user
/// nothing about which of a checkpoint's files to fix).
/// minijinja's instruction budget for rendering one prompt: real chat templates take a few
/// thousand; this many is about a second of rendering.
const RENDER_FUEL: u64 = 20_000_000;

fn describe(source: &str, e: &Error) -> String {
    let mut text = format!("{source}: chat template");
    if let Some(line) = e.line() {
        text.push_str(&format!(", line {line}"));
    }
    text.push_str(&format!(": {}", e.kind()));
    if e.kind() == ErrorKind::OutOfFuel {
        text.push_str(&format!(" (over {RENDER_FUEL} steps rendering one prompt: a loop that does not end?)"));
    }
    if let Some(detail) = e.detail() {
        text.push_str(&format!(": {detail}"));
    }
    text
}

/// `tojson` as transformers defines it: Python's `json.dumps(x, ensure_ascii=False)` (", " and
/// ": " separators, no HTML escaping), `indent` when given; an object's keys come out sorted.
fn python_tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(key).expect("a string serialises"));
                out.push_str(": ");
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).expect("a JSON value serialises")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(text: &str) -> ChatTemplate {
        ChatTemplate::new("test.jinja", text.into(), Some("<s>".into()), None).expect("compiles")
    }

    #[test]
    fn renders_python_string_methods_and_special_tokens() {
        let t = template("{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}|{% endfor %}{% if add_generation_prompt %}A:{% endif %}");
        let messages = serde_json::json!([{"role": "user", "content": "  hi  "}]);
        assert_eq!(t.render(&messages, true, &Default::default()).unwrap(), "<s>HI|A:");
        assert_eq!(t.render(&messages, false, &Default::default()).unwrap(), "<s>HI|");
    }

    #[test]
    fn tojson_writes_python_json_dumps() {
        let t = template("{{ messages[0] | tojson }}");
        let messages = serde_json::json!([{"role": "user", "content": "<a & é>", "n": [1, 2]}]);
        // (keys come out sorted: the dataset's objects are parsed into sorted maps; Python would
        // keep their order)
        assert_eq!(t.render(&messages, false, &Default::default()).unwrap(), r#"{"content": "<a & é>", "n": [1, 2], "role": "user"}"#);
    }

    #[test]
    fn content_parts_render_as_their_joined_text_and_other_parts_are_refused() {
        let prompts = ChatPrompts::new(template("{% for m in messages %}[{{ m.content }}]{% endfor %}"), "", &Default::default()).unwrap();
        let parts = serde_json::json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(prompts.render_messages(vec![parts]).unwrap(), "[a\nb]");
        assert_eq!(prompts.render_messages(vec![serde_json::json!({"role": "user", "content": "a\nb"})]).unwrap(), "[a\nb]");
        let image = serde_json::json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]});
        let e = prompts.render_messages(vec![serde_json::json!({"role": "system", "content": "s"}), image]).unwrap_err();
        assert!(e.contains("message 1") && e.contains("content part 1") && e.contains("image_url"), "{e}");
    }

    #[test]
    fn errors_name_the_source_and_line() {
        let e = ChatTemplate::new("model/tokenizer_config.json", "line one\n{% if %}".into(), None, None).err().expect("a syntax error");
        assert!(e.contains("model/tokenizer_config.json") && e.contains("line 2"), "{e}");
        let t = template("ok\n{{ raise_exception('only user and assistant roles') }}");
        let e = t.render(&serde_json::json!([]), true, &Default::default()).unwrap_err();
        assert!(e.contains("test.jinja") && e.contains("line 2") && e.contains("only user and assistant roles"), "{e}");
        // loops that would run for hours stop at the render budget, naming the line
        let t = template("ok\n{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
        let e = t.render(&serde_json::json!([]), true, &Default::default()).unwrap_err();
        assert!(e.contains("test.jinja") && e.contains("line 2") && e.contains("out of fuel") && e.contains("a loop that does not end"), "{e}");
    }
}
