//! Math answer checking the way RL graders do it (verl's math reward, TRL's accuracy reward):
//! the completion's final answer is taken from the last `\boxed{..}` (or `\fbox{..}`), else the
//! text after the last `####` (GSM8K), else the text after the last "answer is" / "Answer:",
//! else the last number; then it is compared with the ground truth numerically where both read
//! as numbers (fractions, `\frac`/`\dfrac`/`\tfrac`, decimals, thousands separators, signs,
//! scientific notation, a percent sign, `$`, units and words around the number), else as text
//! after LaTeX normalisation (`\left`/`\right`, spacing commands, `\text{..}`, degree marks,
//! surrounding `$` and a final period dropped, whitespace and case folded).

/// 1 when `completion`'s final answer equals `truth`, else 0 (`task.reward = "math"`).
pub fn math_reward(completion: &str, truth: &str) -> f32 {
    // a ground truth written as a worked solution (GSM8K's "... #### 72", "... answer: 72")
    // gives its final answer
    let worked = ["####", "\\boxed", "answer:", "answer is"].iter().any(|m| truth.to_ascii_lowercase().contains(m));
    let truth = if worked { extract_answer(truth).unwrap_or_else(|| truth.to_string()) } else { truth.to_string() };
    match extract_answer(completion) {
        Some(got) if equivalent(&got, &truth) => 1.0,
        _ => 0.0,
    }
}

/// Whether `text` marks its final answer explicitly (`\boxed{..}` / `\fbox{..}`, `#### x`, "answer
/// is" / "Answer:" followed by text): the format a format reward pays for, unlike a bare last
/// number.
pub fn has_marked_answer(text: &str) -> bool {
    let boxed = ["\\boxed", "\\fbox"].iter().any(|c| text.rfind(c).is_some_and(|at| braced(&text[at + c.len()..]).is_some_and(|b| !b.trim().is_empty())));
    let lower = text.to_ascii_lowercase();
    let after = |marker: &str| lower.rfind(marker).is_some_and(|at| !lower[at + marker.len()..].lines().next().unwrap_or("").trim().trim_start_matches(':').trim().is_empty());
    boxed || after("####") || after("answer is") || after("answer:")
}

/// The final answer of `text`, by the rules in the module header.
pub fn extract_answer(text: &str) -> Option<String> {
    for command in ["\\boxed", "\\fbox"] {
        if let Some(at) = text.rfind(command) {
            if let Some(inner) = braced(&text[at + command.len()..]) {
                return Some(inner.trim().to_string());
            }
            // `\boxed 5` (no braces): the next word
            let rest = text[at + command.len()..].trim_start();
            if let Some(word) = rest.split_whitespace().next() {
                return Some(word.trim_start_matches('{').trim_end_matches(['$', '.']).to_string());
            }
        }
    }
    if let Some(at) = text.rfind("####") {
        let rest = text[at + 4..].lines().next().unwrap_or("").trim();
        if !rest.is_empty() {
            return Some(rest.to_string());
        }
    }
    // ASCII lowercasing keeps every byte offset
    let lower = text.to_ascii_lowercase();
    for marker in ["answer is", "answer:"] {
        if let Some(at) = lower.rfind(marker) {
            let rest = text[at + marker.len()..].lines().next().unwrap_or("").trim().trim_start_matches(':').trim();
            if !rest.is_empty() {
                return Some(rest.to_string());
            }
        }
    }
    last_number(text)
}

/// The content of the `{..}` group `s` starts with (after spaces), braces balanced.
fn braced(s: &str) -> Option<&str> {
    let s = s.trim_start();
    let body = s.strip_prefix('{')?;
    let mut depth = 1usize;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&body[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The last number-looking run of `text` (digits with `,` `.` `/` inside, a leading `-`).
fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut end = chars.len();
    while end > 0 && !chars[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut start = end;
    while start > 0 && (chars[start - 1].is_ascii_digit() || (matches!(chars[start - 1], ',' | '.' | '/') && start >= 2 && chars[start - 2].is_ascii_digit())) {
        start -= 1;
    }
    if start > 0 && chars[start - 1] == '-' {
        start -= 1;
    }
    Some(chars[start..end].iter().collect())
}

/// LaTeX and spacing normalisation for a text comparison.
pub fn normalize(s: &str) -> String {
    let mut t = s.trim().to_string();
    // \text{cm} -> cm, \mathrm{..} likewise
    for command in ["\\text", "\\textbf", "\\mathrm", "\\mbox"] {
        while let Some(at) = t.find(&format!("{command}{{")) {
            let Some(inner) = braced(&t[at + command.len()..]).map(str::to_string) else { break };
            t = format!("{}{}{}", &t[..at], inner, &t[at + command.len() + inner.len() + 2..]);
        }
    }
    for (from, to) in [("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""), ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", "%"), ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", "")] {
        t = t.replace(from, to);
    }
    let t = t.trim().trim_end_matches('.').trim();
    t.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// The value of a normalised answer that reads as a number: `\frac{a}{b}`, `a/b`, decimals with
/// thousands separators, scientific notation, a leading `x =`, trailing units or words; a
/// percent sign gives both readings (`50%` is 50 or 0.5).
pub fn numeric_values(normalized: &str) -> Vec<f64> {
    let mut s = normalized.trim();
    // "x = 5", "k=3": the right-hand side
    if let Some(at) = s.rfind('=') {
        s = s[at + 1..].trim();
    }
    let percent = s.contains('%');
    let s = s.replace('%', "");
    let s = s.trim();
    let value = if let Some(rest) = s.strip_prefix("\\frac") {
        frac(rest)
    } else if let Some(rest) = s.strip_prefix("-\\frac") {
        frac(rest).map(|v| -v)
    } else {
        leading_number(s)
    };
    match value {
        Some(v) if percent => vec![v, v / 100.0],
        Some(v) => vec![v],
        None => vec![],
    }
}

fn frac(rest: &str) -> Option<f64> {
    // `\frac12`: two single digits without braces
    let digits: Vec<char> = rest.trim_start().chars().take(2).collect();
    if digits.len() == 2 && digits.iter().all(char::is_ascii_digit) && rest.trim_start().chars().nth(2).is_none_or(|c| !c.is_ascii_digit()) {
        let (a, b) = (digits[0].to_digit(10)? as f64, digits[1].to_digit(10)? as f64);
        return (b != 0.0).then(|| a / b);
    }
    let a = braced(rest)?;
    let after = &rest.trim_start()[a.len() + 2..];
    let b = braced(after)?;
    let (a, b) = (leading_number(a)?, leading_number(b)?);
    (b != 0.0).then(|| a / b)
}

/// The number `s` starts with (then only units or words may follow): `-1,234.5`, `3/4`, `2e-3`.
fn leading_number(s: &str) -> Option<f64> {
    let s = s.trim().trim_start_matches('+');
    // ".5" reads as "0.5"
    let padded;
    let s = if s.starts_with('.') || s.starts_with("-.") {
        padded = s.replacen('.', "0.", 1);
        padded.as_str()
    } else {
        s
    };
    let mut end = 0;
    let bytes = s.as_bytes();
    let mut seen_digit = false;
    while end < bytes.len() {
        let c = bytes[end] as char;
        let ok = c.is_ascii_digit()
            || (c == '-' && end == 0)
            || (matches!(c, '.' | ',' | '/') && end + 1 < bytes.len() && (bytes[end + 1] as char).is_ascii_digit() && seen_digit)
            || (matches!(c, 'e' | 'E') && seen_digit && end + 1 < bytes.len() && ((bytes[end + 1] as char).is_ascii_digit() || bytes[end + 1] == b'-'));
        if !ok {
            break;
        }
        seen_digit |= c.is_ascii_digit();
        end += 1;
    }
    if !seen_digit {
        return None;
    }
    let (number, rest) = (&s[..end], s[end..].trim());
    // only units or words may follow: "12 cm", "5 apples"; not "5 + 3", "2x"
    if rest.starts_with(|c: char| c.is_ascii_digit() || "+-*^_{}()[]\\".contains(c)) || rest.starts_with(|c: char| c.is_alphabetic()) && !s[end..].starts_with(' ') {
        return None;
    }
    if let Some((a, b)) = number.split_once('/') {
        let (a, b) = (a.replace(',', "").parse::<f64>().ok()?, b.replace(',', "").parse::<f64>().ok()?);
        return (b != 0.0).then(|| a / b);
    }
    // commas are thousands separators only in groups of three
    if number.contains(',') {
        let int_part = number.split('.').next().unwrap_or("");
        let groups: Vec<&str> = int_part.trim_start_matches('-').split(',').collect();
        if groups.len() < 2 || groups[0].is_empty() || groups[0].len() > 3 || groups[1..].iter().any(|g| g.len() != 3) {
            return None;
        }
    }
    number.replace(',', "").parse::<f64>().ok()
}

/// Whether two extracted answers are the same: numerically (relative 1e-6) when both read as
/// numbers, else as normalised text.
pub fn equivalent(got: &str, truth: &str) -> bool {
    let (g, t) = (normalize(got), normalize(truth));
    if g.replace(' ', "") == t.replace(' ', "") {
        return true;
    }
    let (gv, tv) = (numeric_values(&g), numeric_values(&t));
    if gv.is_empty() || tv.is_empty() {
        return false;
    }
    gv.iter().any(|a| tv.iter().any(|b| (a - b).abs() <= 1e-6 * b.abs().max(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (ground truth, completion, reward): answers as real models write them.
    const CORPUS: &[(&str, &str, f32)] = &[
        ("72", "Natalia sold 48/2 = 24 clips in May. 48+24 = 72.\n#### 72", 1.0),
        ("72", "#### 72.", 1.0),
        ("72", "so the answer is $72$.", 1.0),
        ("72", "The answer is: 72 clips", 1.0),
        ("72", "Answer: 72", 1.0),
        ("72", "... which gives \\boxed{72}.", 1.0),
        ("72", "\\boxed{72.0}", 1.0),
        ("72", "\\boxed{ 72 }", 1.0),
        ("72", "I think 70, no wait, 72", 1.0),
        ("72", "\\boxed{71}", 0.0),
        ("72", "first \\boxed{72} then corrected: \\boxed{73}", 0.0),
        ("1000", "\\boxed{1,000}", 1.0),
        ("1234567", "#### 1,234,567", 1.0),
        ("1.5", "\\boxed{1,5}", 0.0),
        ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}", 1.0),
        ("\\frac{3}{4}", "\\boxed{0.75}", 1.0),
        ("0.75", "\\boxed{3/4}", 1.0),
        ("\\frac{1}{3}", "\\boxed{0.333}", 0.0),
        ("-\\frac{1}{2}", "\\boxed{-0.5}", 1.0),
        ("\\tfrac{5}{2}", "\\boxed{\\frac{5}{2}}", 1.0),
        ("-3", "\\boxed{-3}", 1.0),
        ("-3", "\\boxed{3}", 0.0),
        ("+7", "\\boxed{7}", 1.0),
        ("12", "\\boxed{12\\text{ cm}}", 1.0),
        ("12", "\\boxed{12 \\text{cm}^2}", 1.0),
        ("90", "\\boxed{90^\\circ}", 1.0),
        ("50", "\\boxed{50\\%}", 1.0),
        ("0.5", "\\boxed{50\\%}", 1.0),
        ("18", "\\boxed{\\$18}", 1.0),
        ("18", "The total cost is $18.00.", 1.0),
        ("5", "\\boxed{x = 5}", 1.0),
        ("2x+1", "\\boxed{2x + 1}", 1.0),
        ("2x+1", "\\boxed{2x+2}", 0.0),
        ("\\sqrt{2}", "\\boxed{\\sqrt{2}}", 1.0),
        ("\\left( 1, 2 \\right)", "\\boxed{\\left(1,2\\right)}", 1.0),
        ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\dfrac{\\sqrt{3}}{2}}", 1.0),
        ("{1,2}", "\\boxed{{1,2}}", 1.0),
        ("2.5e3", "\\boxed{2500}", 1.0),
        ("10", "There are no numbers here.", 0.0),
        ("10", "", 0.0),
        ("10", "\\boxed{10", 1.0),
        ("Yes", "\\boxed{yes}", 1.0),
        ("#### 8", "The answer is 8", 1.0),
        ("3", "\\boxed{3.0000001}", 1.0),
        ("3", "\\boxed{3.01}", 0.0),
        ("24", "\\boxed{24}\n\nFinal Answer: The final answer is 24. I hope it is correct.", 1.0),
        ("-12", "so the answer is -12.", 1.0),
        ("0.5", "\\boxed{.5}", 1.0),
        ("100", "\\boxed{100.}", 1.0),
        ("2", "\\boxed{\\frac{4}{2}}", 1.0),
        ("1/2", "\\boxed{\\frac12}", 1.0),
        ("6", "Therefore, $x = \\boxed{6}$.", 1.0),
        ("1,000,000", "\\boxed{1000000}", 1.0),
        ("3.14", "\\boxed{\\pi}", 0.0),
        ("\\$1.50", "\\boxed{1.5}", 1.0),
        ("7", "\\boxed{\\textbf{7}}", 1.0),
        ("10", "####10", 1.0),
        ("-5", "\\boxed{- 5}", 1.0),
        ("12", "12", 1.0),
    ];

    #[test]
    fn a_marked_answer_is_a_box_a_hash_mark_or_an_answer_phrase_not_a_bare_number() {
        for marked in ["so \\boxed{42}", "work\n#### 7", "The answer is 12.", "Answer: x = 3", "\\fbox{a}"] {
            assert!(has_marked_answer(marked), "{marked}");
        }
        for bare in ["it is 42", "\\boxed{}", "#### ", "no answer here", "the answer is"] {
            assert!(!has_marked_answer(bare), "{bare}");
        }
    }

    #[test]
    fn the_tricky_answer_corpus_grades_as_a_human_would() {
        let mut wrong = Vec::new();
        for &(truth, completion, want) in CORPUS {
            let got = math_reward(completion, truth);
            if got != want {
                wrong.push(format!("truth {truth:?}, completion {completion:?}: {got} (extracted {:?})", extract_answer(completion)));
            }
        }
        assert!(wrong.is_empty(), "{} of {} cases graded wrong:\n{}", wrong.len(), CORPUS.len(), wrong.join("\n"));
    }

    #[test]
    fn nested_braces_and_the_last_box_win() {
        assert_eq!(extract_answer("\\boxed{\\frac{1}{2}} and later \\boxed{\\frac{\\sqrt{3}}{2}}").as_deref(), Some("\\frac{\\sqrt{3}}{2}"));
        assert_eq!(last_number("x -12,345.5 y").as_deref(), Some("-12,345.5"));
    }
}
