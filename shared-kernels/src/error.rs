use std::fmt;

/// A launcher refused its inputs. Names the op and what it was given, so a bad shape is
/// reported at the call site rather than as an out-of-bounds read deep inside a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub op: &'static str,
    pub message: String,
}

impl KernelError {
    pub fn new(op: &'static str, message: impl Into<String>) -> Self {
        Self { op, message: message.into() }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for KernelError {}

/// `ensure!(cond, op, "fmt", args)`: return a [`KernelError`] when `cond` is false.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $op:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::KernelError::new($op, format!($($fmt)+)));
        }
    };
}
