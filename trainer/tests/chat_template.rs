//! lockstep's chat template rendering against transformers' own (`apply_chat_template`'s
//! renderer), on the Qwen3 and Llama 3 templates: the expected strings were rendered by
//! transformers (experiments/fixtures/chat_template_fixtures.py) and are compared byte for byte.

use trainer::chat::ChatTemplate;

#[test]
fn renders_as_transformers_does() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
    let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 12, "the fixture holds {} cases", cases.len());
    for case in cases {
        let name = format!("{} / {}", case["template"].as_str().unwrap(), case["name"].as_str().unwrap());
        let file = dir.join(format!("{}.jinja", case["template"].as_str().unwrap()));
        let token = |k: &str| case["special"][k].as_str().map(str::to_string);
        let template = ChatTemplate::new(&file.display().to_string(), std::fs::read_to_string(&file).unwrap(), token("bos_token"), token("eos_token")).unwrap();
        let mut extra = case["options"].as_object().unwrap().clone();
        let add = extra.remove("add_generation_prompt").and_then(|v| v.as_bool()).unwrap();
        let got = template.render(&case["messages"], add, &extra).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, case["expected"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn a_checkpoint_folder_gives_its_template_from_tokenizer_config() {
    let dir = shared_kernels::testing::Scratch::new("chat");
    let config = serde_json::json!({"chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}", "eos_token": {"content": "<|im_end|>"}});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let t = ChatTemplate::from_checkpoint(&dir, None).unwrap();
    assert_eq!(t.render(&serde_json::json!([{"role": "user", "content": "hi"}]), true, &Default::default()).unwrap(), "[user]hi<|im_end|>");
    // chat_template.jinja, transformers' newer layout, wins over tokenizer_config.json
    std::fs::write(dir.join("chat_template.jinja"), "J{{ messages | length }}").unwrap();
    let t = ChatTemplate::from_checkpoint(&dir, None).unwrap();
    assert_eq!(t.render(&serde_json::json!([{"role": "user", "content": "hi"}]), true, &Default::default()).unwrap(), "J1");
    std::fs::remove_dir_all(&dir).unwrap();
    let e = ChatTemplate::from_checkpoint(&dir, None).err().unwrap();
    assert!(e.contains("no chat template") && e.contains("task.chat_template"), "{e}");
}
