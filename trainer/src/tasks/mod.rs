//! Verifiable tasks: a generator of problems with exact answers, and a reward that checks a
//! completion. Built in: addition, sort, countdown, word problems; or a user's dataset (JSONL or
//! Parquet, `dataset.rs`).

use crate::config::TaskSection;
use crate::rng::SplitMix;
use std::path::Path;

mod chains;
mod dataset;
pub mod fit;
mod problem;
pub mod records;

pub use dataset::epoch_permutation;
pub use problem::{Problem, TaskError};
use dataset::load_dataset;

pub enum Task {
    Addition { digits: usize },
    Sort { count: usize },
    Countdown { count: usize },
    /// Grade-school word problems with a worked solution ending `\boxed{N}` (graded by the math
    /// verifier, `task.reward = "math"`).
    WordProblems { digits: usize },
    /// A chain of + and - worked one step at a time, ending `\boxed{N}` (`chains.rs`).
    LongArithmetic { terms: usize, digits: usize },
    Dataset { problems: Vec<Problem> },
    /// Agent episodes: records handed to `environment.command` (`records.rs`).
    Environment { records: Vec<(usize, serde_json::Value)>, file: String },
    /// Another task whose prompts the chat template renders as they are drawn.
    Chat { inner: Box<Task>, chat: crate::chat::ChatPrompts },
}


impl Task {
    pub fn from_config(c: &TaskSection) -> Result<Self, TaskError> {
        if let Some((key, value, range)) = c.generated_size().filter(|(_, v, r)| !r.contains(v)) {
            return Err(TaskError { file: "config".into(), line: 0, message: format!("{key} must be in {}..={} for {}, got {value}", range.start(), range.end(), c.name) });
        }
        Ok(match c.name.as_str() {
            "addition" => Task::Addition { digits: c.digits },
            "sort" => Task::Sort { count: c.count },
            "countdown" => Task::Countdown { count: c.count },
            "word_problems" => Task::WordProblems { digits: c.digits },
            "long_arithmetic" => {
                if !(1..=4).contains(&c.digits) {
                    return Err(TaskError { file: "config".into(), line: 0, message: format!("task.digits must be in 1..=4 for long_arithmetic, got {}", c.digits) });
                }
                Task::LongArithmetic { terms: c.count, digits: c.digits }
            }
            "environment" => Task::Environment { records: records::load(Path::new(&c.path))?, file: c.path.clone() },
            _ => Task::Dataset { problems: load_dataset(Path::new(&c.path), c)? },
        })
    }

    /// This task with its prompts rendered by `chat`: a dataset's all at once (an error names
    /// the line), a generator's as each problem is drawn (one rendered now, so a template that
    /// fails does so before the run starts).
    pub fn with_chat(self, chat: crate::chat::ChatPrompts, file: &str) -> Result<Task, TaskError> {
        match self {
            Task::Dataset { mut problems } => {
                for p in &mut problems {
                    p.prompt = chat.render(p).map_err(|message| TaskError { file: file.to_string(), line: p.line, message })?;
                    p.messages = None;
                }
                Ok(Task::Dataset { problems })
            }
            Task::Chat { inner, .. } => inner.with_chat(chat, file),
            // records without demos are fine until an SFT warm start asks for one
            environment @ Task::Environment { .. } => Ok(Task::Chat { inner: Box::new(environment), chat }),
            generator => {
                let task = Task::Chat { inner: Box::new(generator), chat };
                task.sample(&mut SplitMix::new(0))?;
                Ok(task)
            }
        }
    }

    pub fn sample(&self, rng: &mut SplitMix) -> Result<Problem, TaskError> {
        let plain = |prompt: String, answer: String| Problem { prompt, answer, numbers: vec![], target: 0, line: 0, messages: None };
        Ok(match self {
            Task::Addition { digits } => {
                let top = 10u64.pow(*digits as u32);
                let (a, b) = (rng.below(top), rng.below(top));
                plain(format!("{a}+{b}="), (a + b).to_string())
            }
            Task::Sort { count } => {
                let digits: Vec<u64> = (0..*count).map(|_| rng.below(10)).collect();
                let mut sorted = digits.clone();
                sorted.sort();
                let s = |v: &[u64]| v.iter().map(|d| d.to_string()).collect::<String>();
                plain(format!("sort {}:", s(&digits)), s(&sorted))
            }
            Task::WordProblems { digits } => word_problem(rng, *digits),
            Task::LongArithmetic { terms, digits } => chains::long_arithmetic(rng, *terms, *digits),
            Task::Countdown { count } => {
                let numbers: Vec<i64> = (0..*count).map(|_| 1 + rng.below(9) as i64).collect();
                let mut expr = numbers[0].to_string();
                let mut value = numbers[0];
                for &n in &numbers[1..] {
                    // left to right with + and - only keeps the SFT answer's value obvious
                    if rng.below(2) == 0 {
                        expr = format!("{expr}+{n}");
                        value += n;
                    } else {
                        expr = format!("{expr}-{n}");
                        value -= n;
                    }
                }
                let list = numbers.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
                Problem { prompt: format!("{list}>{value}:"), answer: expr, numbers, target: value, line: 0, messages: None }
            }
            Task::Dataset { problems } => problems[rng.below(problems.len() as u64) as usize].clone(),
            Task::Environment { records, file } => {
                let (line, v) = &records[rng.below(records.len() as u64) as usize];
                records::demo_problem(file, *line, v, &mut |n| rng.below(n))?
            }
            Task::Chat { inner, chat } => {
                let mut p = inner.sample(rng)?;
                p.prompt = chat.render(&p).map_err(|message| TaskError { file: "task.chat_template".into(), line: 0, message })?;
                p
            }
        })
    }

    /// The reward `kind` (`task.reward`) gives `completion`.
    /// Problem `index` of a run's prompt stream (`step * prompts_per_step + k`): for a dataset,
    /// epochs in order, each a permutation of the file's problems keyed by (seed, epoch), so a
    /// step's prompts depend on (seed, step) alone and a resumed run continues at the same
    /// example; generators draw from `rng` (keyed by the step by the caller). (A chat dataset's
    /// prompts are rendered at load, so it is a plain dataset here.)
    pub fn problem_at(&self, seed: u64, index: u64, rng: &mut SplitMix) -> Result<Problem, TaskError> {
        match self {
            Task::Dataset { problems } => {
                let n = problems.len() as u64;
                let (epoch, position) = (index / n, index % n);
                Ok(problems[epoch_permutation(seed, epoch, problems.len())[position as usize]].clone())
            }
            _ => self.sample(rng),
        }
    }

    /// An environment task's records (through a chat wrapper too); `None` for other tasks.
    pub fn records(&self) -> Option<&[(usize, serde_json::Value)]> {
        match self {
            Task::Environment { records, .. } => Some(records),
            Task::Chat { inner, .. } => inner.records(),
            _ => None,
        }
    }

    /// Record `index` of an environment task's stream, in the dataset's order (epochs of
    /// permutations keyed by (seed, epoch)): its line and the record.
    pub fn record_at(&self, seed: u64, index: u64) -> Option<(usize, &serde_json::Value)> {
        let records = self.records()?;
        let n = records.len() as u64;
        let (epoch, position) = (index / n, index % n);
        let (line, v) = &records[epoch_permutation(seed, epoch, records.len())[position as usize]];
        Some((*line, v))
    }

    /// The reward `[task]` configures: `reward_of(task.reward)`, and with `task.format_score`
    /// (verl's format score, `math` only) a wrong completion whose final answer is marked
    /// (`\boxed{}`, `####`, "answer is") earns that score instead of 0.
    pub fn reward_for(&self, c: &TaskSection, problem: &Problem, completion: &str) -> f32 {
        let r = self.reward_of(&c.reward, problem, completion);
        if c.reward == "math" && r == 0.0 && c.format_score > 0.0 && crate::math_verify::has_marked_answer(completion) {
            return c.format_score as f32;
        }
        r
    }

    pub fn reward_of(&self, kind: &str, problem: &Problem, completion: &str) -> f32 {
        match kind {
            "char_f1" => char_f1(completion.trim(), &problem.answer),
            "math" => crate::math_verify::math_reward(completion, &problem.answer),
            _ => self.reward(problem, completion),
        }
    }

    /// 1 for a correct completion (text up to the end-of-sequence token), else 0.
    pub fn reward(&self, problem: &Problem, completion: &str) -> f32 {
        let text = completion.trim();
        let correct = match self {
            Task::Chat { inner, .. } => return inner.reward(problem, completion),
            Task::Countdown { .. } => countdown_value(text, &problem.numbers) == Some(problem.target),
            _ => text == problem.answer,
        };
        if correct { 1.0 } else { 0.0 }
    }
}

/// A word problem: who has how many of what, an addition, a subtraction or a product, and the
/// worked solution ending `\boxed{N}` as MATH's solutions do (lower case: the embedded
/// tokenizer's characters, with `\{}` added for this task).
fn word_problem(rng: &mut SplitMix, digits: usize) -> Problem {
    const NAMES: [&str; 6] = ["tom", "ana", "li", "sam", "max", "eva"];
    const ITEMS: [&str; 5] = ["apples", "pens", "books", "cups", "stamps"];
    let top = 10u64.pow(digits as u32);
    let name = NAMES[rng.below(NAMES.len() as u64) as usize];
    let items = ITEMS[rng.below(ITEMS.len() as u64) as usize];
    let (a, b) = (1 + rng.below(top - 1), 1 + rng.below(top - 1));
    let (prompt, work, value) = match rng.below(3) {
        0 => (format!("{name} has {a} {items} and gets {b} more. how many {items} now?"), format!("{a}+{b}"), a + b),
        1 => {
            let (a, b) = (a.max(b), a.min(b));
            (format!("{name} has {a} {items} and gives {b} away. how many are left?"), format!("{a}-{b}"), a - b)
        }
        _ => (format!("{name} buys {a} bags of {b} {items}. how many {items}?"), format!("{a}*{b}"), a * b),
    };
    Problem { prompt: format!("{prompt} "), answer: format!("{work}={value}. \\boxed{{{value}}}"), numbers: vec![], target: 0, line: 0, messages: None }
}

/// F1 of the characters of `got` and `want` as multisets: partial credit that moves with every
/// character, so even a random policy's rollouts get distinct rewards (advantages not all 0).
pub fn char_f1(got: &str, want: &str) -> f32 {
    let count = |s: &str| {
        let mut m = std::collections::BTreeMap::new();
        for c in s.chars() {
            *m.entry(c).or_insert(0usize) += 1;
        }
        m
    };
    let (g, w) = (count(got), count(want));
    let common: usize = g.iter().map(|(c, n)| (*n).min(*w.get(c).unwrap_or(&0))).sum();
    let (ng, nw) = (got.chars().count(), want.chars().count());
    if common == 0 || ng == 0 || nw == 0 {
        return 0.0;
    }
    let (p, r) = (common as f64 / ng as f64, common as f64 / nw as f64);
    (2.0 * p * r / (p + r)) as f32
}

/// Value of `a op b op c ...` (left to right, + - *), if it uses each given number at most once.
fn countdown_value(expr: &str, numbers: &[i64]) -> Option<i64> {
    let mut unused = numbers.to_vec();
    let mut take = |n: i64| unused.iter().position(|&u| u == n).map(|i| unused.swap_remove(i));
    let mut value: Option<i64> = None;
    let mut op = '+';
    let mut digits = String::new();
    for c in expr.chars().chain(std::iter::once('#')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: i64 = digits.parse().ok()?;
        digits.clear();
        take(n)?;
        value = Some(match (value, op) {
            (None, _) => n,
            (Some(v), '+') => v.checked_add(n)?,
            (Some(v), '-') => v.checked_sub(n)?,
            (Some(v), '*') => v.checked_mul(n)?,
            _ => return None,
        });
        match c {
            '+' | '-' | '*' => op = c,
            '#' => break,
            _ => return None,
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_math_reward_grades_the_final_answer_against_the_dataset_answer() {
        let task = Task::Dataset { problems: vec![] };
        let problem = Problem { prompt: "p".into(), answer: "3/4".into(), numbers: vec![], target: 0, line: 1, messages: None };
        assert_eq!(task.reward_of("math", &problem, "so it is \\boxed{0.75}."), 1.0);
        assert_eq!(task.reward_of("math", &problem, "\\boxed{0.7}"), 0.0);
        assert_eq!(task.reward_of("exact", &problem, "\\boxed{0.75}"), 0.0);
    }

    #[test]
    fn a_verl_parquet_file_gives_its_nested_prompt_and_ground_truth() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datasets/verl_math.parquet");
        let c = TaskSection { name: "dataset".into(), path: path.display().to_string(), prompt_format: crate::config::PromptFormat::Chat, answer_key: "reward_model.ground_truth".into(), ..Default::default() };
        let Task::Dataset { problems } = Task::from_config(&c).unwrap() else { panic!("a dataset task") };
        assert_eq!(problems.len(), 4);
        assert_eq!((problems[1].answer.as_str(), problems[1].line), ("5", 2));
        assert_eq!(problems[1].messages, Some(serde_json::json!([{"role": "user", "content": "2+3="}])));
        // the same file as raw prompts names the row and the key that renders it
        let raw = TaskSection { prompt_format: crate::config::PromptFormat::Raw, ..c.clone() };
        let e = Task::from_config(&raw).err().expect("a message list as a raw prompt").to_string();
        assert!(e.contains("verl_math.parquet:1") && e.contains("task.prompt_format"), "{e}");
        let missing = TaskSection { answer_key: "reward_model.answer".into(), ..c };
        let e = Task::from_config(&missing).err().expect("no such key").to_string();
        assert!(e.contains(":1") && e.contains("reward_model.answer"), "{e}");
    }

    #[test]
    fn a_dataset_is_walked_in_epochs_each_a_keyed_permutation() {
        let problems: Vec<Problem> = (0..7).map(|i| Problem { prompt: format!("{i}"), answer: String::new(), numbers: vec![], target: 0, line: i + 1, messages: None }).collect();
        let task = Task::Dataset { problems };
        let at = |seed: u64, i: u64| task.problem_at(seed, i, &mut SplitMix::new(0)).unwrap().line;
        for epoch in 0..3u64 {
            let mut seen: Vec<usize> = (0..7).map(|k| at(5, epoch * 7 + k)).collect();
            seen.sort();
            assert_eq!(seen, (1..=7).collect::<Vec<_>>(), "epoch {epoch} visits every problem once");
        }
        let first: Vec<usize> = (0..7).map(|k| at(5, k)).collect();
        let second: Vec<usize> = (7..14).map(|k| at(5, k)).collect();
        assert_ne!(first, second, "each epoch has its own order");
        assert_eq!(first, (0..7).map(|k| at(5, k)).collect::<Vec<_>>(), "an index's problem depends on (seed, index) alone");
        assert_ne!(first, (0..7).map(|k| at(6, k)).collect::<Vec<_>>(), "the seed keys the order");
    }

    #[test]
    fn the_format_score_pays_a_marked_wrong_answer_and_nothing_else() {
        let task = Task::Dataset { problems: vec![] };
        let problem = Problem { prompt: "p".into(), answer: "12".into(), numbers: vec![], target: 0, line: 1, messages: None };
        let c = TaskSection { reward: "math".into(), format_score: 0.1, ..Default::default() };
        assert_eq!(task.reward_for(&c, &problem, "\\boxed{12}"), 1.0);
        assert_eq!(task.reward_for(&c, &problem, "\\boxed{13}"), 0.1);
        assert_eq!(task.reward_for(&c, &problem, "13"), 0.0, "a bare number is not the format");
        let off = TaskSection { format_score: 0.0, ..c };
        assert_eq!(task.reward_for(&off, &problem, "\\boxed{13}"), 0.0);
    }

    #[test]
    fn char_f1_gives_partial_credit_in_unit_range() {
        assert_eq!(char_f1("123", "123"), 1.0);
        assert_eq!(char_f1("abc", "123"), 0.0);
        assert_eq!(char_f1("", "123"), 0.0);
        // "1x" vs "12": one common character, precision 1/2, recall 1/2
        assert!((char_f1("1x", "12") - 0.5).abs() < 1e-6);
        // multisets: "11" vs "1" has one common character
        assert!((char_f1("11", "1") - 2.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn countdown_checks_numbers_and_value() {
        assert_eq!(countdown_value("3+5-2", &[2, 3, 5]), Some(6));
        assert_eq!(countdown_value("3*5", &[3, 5, 7]), Some(15));
        assert_eq!(countdown_value("3+3", &[3, 5]), None, "a number used twice");
        assert_eq!(countdown_value("3+", &[3]), None);
        assert_eq!(countdown_value("", &[3]), None);
    }

    #[test]
    fn word_problems_solutions_earn_the_math_reward_and_wrong_finals_do_not() {
        let task = Task::WordProblems { digits: 2 };
        let mut rng = SplitMix::new(3);
        for _ in 0..50 {
            let p = task.sample(&mut rng).unwrap();
            assert_eq!(task.reward_of("math", &p, &p.answer), 1.0, "{p:?}");
            assert!(p.answer.ends_with('}') && p.answer.contains(". \\boxed{"), "{p:?}");
            let wrong = p.answer.replace('}', "1}");
            assert_eq!(task.reward_of("math", &p, &wrong), 0.0, "{p:?}");
            assert!(crate::math_verify::has_marked_answer(&p.answer), "{p:?}");
            assert!(crate::vocab::char_tokenizer(crate::vocab::extra_chars("word_problems")).encode(format!("{}{}", p.prompt, p.answer), false).unwrap().get_ids().iter().all(|&id| id > 1), "a character outside the embedded vocabulary: {p:?}");
        }
    }

    #[test]
    fn generated_answers_earn_full_reward() {
        for task in [Task::Addition { digits: 2 }, Task::Sort { count: 4 }, Task::Countdown { count: 3 }] {
            let mut rng = SplitMix::new(9);
            for _ in 0..50 {
                let p = task.sample(&mut rng).unwrap();
                assert_eq!(task.reward(&p, &p.answer), 1.0, "{p:?}");
                assert_eq!(task.reward(&p, "x"), 0.0);
            }
        }
    }
}
