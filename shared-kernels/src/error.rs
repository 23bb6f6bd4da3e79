use std::cell::RefCell;
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

/// One input of a launch as recorded for error reports: kept as data and formatted only when
/// a report is made, since every input of every launch is recorded (the decode path's host time
/// per step is a sum over hundreds of launches).
#[derive(Clone, Copy)]
struct NotedInput {
    name: &'static str,
    rank: usize,
    shape: [usize; MAX_NOTED_RANK],
    dtype: burn::tensor::DType,
}

const MAX_NOTED_RANK: usize = 6;

impl fmt::Display for NotedInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} {:?}", self.name, &self.shape[..self.rank], self.dtype)
    }
}

thread_local! {
    /// The op whose launcher ran last on this thread and the inputs it was given, so a panic
    /// inside burn or cubecl can be reported with the op and the sizes ([`last_launch`]).
    static LAST_LAUNCH: RefCell<(&'static str, Vec<NotedInput>)> = const { RefCell::new(("", Vec::new())) };
}

/// Records input `name` of launcher `op` (called by the bridge for every input of every
/// launch). `LOCKSTEP_FAULT_PANIC=<op>` makes the launcher `op` panic here: a failpoint for the
/// fault suite, which checks that such a panic reaches the user as an error naming the op.
pub(crate) fn note_input(op: &'static str, name: &'static str, shape: &[usize], dtype: burn::tensor::DType) {
    LAST_LAUNCH.with(|last| {
        let mut last = last.borrow_mut();
        // a new launch: another op, or an input name this launch already gave
        if last.0 != op || last.1.iter().any(|e| e.name == name) {
            last.0 = op;
            last.1.clear();
            *LAST_OP_ANY_THREAD.lock().unwrap_or_else(|e| e.into_inner()) = op;
        }
        let rank = shape.len().min(MAX_NOTED_RANK);
        let mut noted = NotedInput { name, rank, shape: [0; MAX_NOTED_RANK], dtype };
        noted.shape[..rank].copy_from_slice(&shape[..rank]);
        last.1.push(noted);
    });
    static FAULT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if FAULT.get_or_init(|| crate::knobs::var("LOCKSTEP_FAULT_PANIC")).as_deref() == Some(op) {
        panic!("fault injection: LOCKSTEP_FAULT_PANIC={op}");
    }
}

/// The op whose launcher any thread entered last, for reports from threads that launch
/// nothing themselves (cubecl's device runner threads).
static LAST_OP_ANY_THREAD: std::sync::Mutex<&'static str> = std::sync::Mutex::new("");

/// The op whose launcher any thread entered last, if any.
pub fn last_op_any_thread() -> Option<&'static str> {
    let op = *LAST_OP_ANY_THREAD.lock().unwrap_or_else(|e| e.into_inner());
    (!op.is_empty()).then_some(op)
}

/// `LOCKSTEP_FAULT_DEVICE_PANIC=<op>`: the first time launcher `op` is entered, a task that
/// panics is queued on the device's cubecl runner thread, as a panic inside cubecl's server
/// would be. cubecl catches such a panic there and only logs it, and the launches queued with
/// it are missing, so the fault suite checks that `lockstep` stops at that log line.
pub(crate) fn device_thread_fault(op: &'static str, device: &burn_cubecl::CubeDevice) {
    use cubecl_common::device::{DeviceId, DeviceService, ServerUtilitiesHandle};
    use cubecl_common::device_handle::DeviceHandle;
    static FAULT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    static FIRED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if FAULT.get_or_init(|| crate::knobs::var("LOCKSTEP_FAULT_DEVICE_PANIC")).as_deref() != Some(op) || FIRED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    struct Fault;
    impl DeviceService for Fault {
        fn init(_: DeviceId) -> Self {
            Fault
        }
        fn utilities(&self) -> ServerUtilitiesHandle {
            std::sync::Arc::new(())
        }
    }
    let handle = DeviceHandle::<Fault>::new(device.to_id());
    handle.submit(move |_| panic!("fault injection: LOCKSTEP_FAULT_DEVICE_PANIC={op}"));
    // queued tasks run at the runner's next flush; this service's runner may see no other
    handle.flush_queue();
}

/// "`op` with x [rows, cols] BF16, w [..] BF16": the launch this thread entered last, if any.
pub fn last_launch() -> Option<String> {
    LAST_LAUNCH.with(|last| {
        let last = last.borrow();
        (!last.0.is_empty()).then(|| format!("`{}` with {}", last.0, last.1.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")))
    })
}

/// The text of a panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}
