//! A task's problem (prompt, answer, where it came from) and the error naming a task file's
//! line: below the generators, the dataset reader and the chat rendering, which all use them.

#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub prompt: String,
    /// A correct answer (used for SFT warm starts and exact-match rewards).
    pub answer: String,
    /// countdown: the numbers and the target, for checking other correct expressions.
    pub numbers: Vec<i64>,
    pub target: i64,
    /// The line of a dataset's file it came from (from 1; 0 for generated problems).
    pub line: usize,
    /// A dataset's prompt as a list of chat messages (`task.prompt_format = "chat"`), until
    /// the chat template renders it into `prompt`.
    pub messages: Option<serde_json::Value>,
}

/// A problem at a line of a task file, or (`line` 0) with the whole file.
#[derive(Debug)]
pub struct TaskError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file, self.message),
            line => write!(f, "{}:{line}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for TaskError {}
