//! `long_arithmetic`: a chain of additions and subtractions worked one step at a time, ending
//! `\boxed{N}` (graded by `task.reward = "math"`), so a policy writes answers hundreds of tokens
//! long: with 20 terms of 3 digits a solution is ~280 characters. It is the long-answer task of
//! the mismatch experiment (docs/ablation.md), where the sampler's and the trainer's logprobs
//! have many tokens to drift apart over.

use super::Problem;
use crate::rng::SplitMix;

/// A chain of `terms` numbers of up to `digits` digits joined by + and -: the prompt
/// `"compute 12+345-67. "`, the solution `"12+345=357. 357-67=290. \boxed{290}"`.
pub fn long_arithmetic(rng: &mut SplitMix, terms: usize, digits: usize) -> Problem {
    let top = 10u64.pow(digits as u32);
    let numbers: Vec<i64> = (0..terms).map(|_| 1 + rng.below(top - 1) as i64).collect();
    let plus: Vec<bool> = (1..terms).map(|_| rng.below(2) == 0).collect();
    let mut prompt = numbers[0].to_string();
    let mut work = String::new();
    let mut value = numbers[0];
    for (k, &n) in numbers[1..].iter().enumerate() {
        let (op, next) = if plus[k] { ('+', value + n) } else { ('-', value - n) };
        prompt.push(op);
        prompt.push_str(&n.to_string());
        work.push_str(&format!("{value}{op}{n}={next}. "));
        value = next;
    }
    Problem { prompt: format!("compute {prompt}. "), answer: format!("{work}\\boxed{{{value}}}"), numbers: vec![], target: 0, line: 0, messages: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::Task;

    #[test]
    fn chains_are_worked_step_by_step_and_only_the_right_final_earns_the_math_reward() {
        let task = Task::LongArithmetic { terms: 20, digits: 3 };
        let mut rng = SplitMix::new(11);
        let mut lengths = 0;
        for _ in 0..50 {
            let p = task.sample(&mut rng).unwrap();
            assert_eq!(task.reward_of("math", &p, &p.answer), 1.0, "{p:?}");
            assert_eq!(p.answer.matches(". ").count(), 19, "one step a term after the first: {p:?}");
            let wrong = p.answer.replace('}', "1}");
            assert_eq!(task.reward_of("math", &p, &wrong), 0.0, "{wrong}");
            lengths += p.answer.len();
        }
        assert!(lengths / 50 >= 200, "answers average {} characters", lengths / 50);
        // the embedded tokenizer holds every character the task writes
        let tok = crate::vocab::char_tokenizer(crate::vocab::extra_chars("long_arithmetic"));
        let p = task.sample(&mut rng).unwrap();
        crate::policy::encode(&tok, &format!("{}{}", p.prompt, p.answer)).unwrap();
    }
}
