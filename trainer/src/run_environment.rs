//! What besides the config and the data decides a run's bits: the kernel variables that change
//! arithmetic (`KernelChoice::arithmetic`, e.g. `LOCKSTEP_BACKWARD_MATH`) and the lockstep
//! build. Recorded in the run folder at its start (`environment.resolved.json`), so that a
//! `--resume` under other arithmetic is refused as a changed config is (the resumed steps would
//! not repeat the uninterrupted run), and one on another build is named in a warning.

use crate::config::ConfigError;
use crate::error::RunError;
use std::collections::BTreeMap;
use std::path::Path;

/// The lockstep commit this binary was built from (trainer/build.rs), "unknown" when it was
/// built outside a git checkout.
pub fn git_revision() -> String {
    env!("BUILD_GIT_REVISION").to_string()
}

const FILE: &str = "environment.resolved.json";
/// How a variable that does not apply on this device appears beside one that did.
const NOT_USED: &str = "(not used on this device)";

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Environment {
    /// The lockstep commit the binary was built from ([`git_revision`]).
    pub lockstep_revision: String,
    /// Each arithmetic-changing variable that applies here, with its value.
    pub arithmetic: BTreeMap<String, String>,
}

impl Environment {
    /// This process's.
    pub fn current() -> Result<Environment, RunError> {
        let choice = shared_kernels::kernel_choice::KernelChoice::process().map_err(|e| RunError::Other(format!("the environment: {e}")))?;
        Ok(Environment { lockstep_revision: git_revision(), arithmetic: choice.arithmetic().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() })
    }
}

/// `(variable, at the run's start, now)` for every arithmetic variable that differs.
pub fn arithmetic_changes(before: &Environment, now: &Environment) -> Vec<(String, String, String)> {
    let names: std::collections::BTreeSet<&String> = before.arithmetic.keys().chain(now.arithmetic.keys()).collect();
    let value = |e: &Environment, k: &String| e.arithmetic.get(k).cloned().unwrap_or_else(|| NOT_USED.to_string());
    names.into_iter().filter(|k| before.arithmetic.get(*k) != now.arithmetic.get(*k)).map(|k| (k.clone(), value(before, k), value(now, k))).collect()
}

/// Records this process's environment in the run folder `dir` (written whole or not at all).
pub fn save(dir: &Path) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(&Environment::current()?).expect("json serialises");
    shared_kernels::model::save::write_atomic(&dir.join(FILE), text.as_bytes())?;
    Ok(())
}

/// Refuses a resume whose arithmetic variables differ from the run's start, naming each, unless
/// `allow` (then a warning); warns when the build differs. A run folder without the record (a
/// run started before lockstep wrote it) is resumed with a warning where the arithmetic has a
/// choice.
pub fn check_resume(dir: &Path, allow: bool) -> Result<(), RunError> {
    check_resume_against(dir, &Environment::current()?, allow)
}

fn check_resume_against(dir: &Path, now: &Environment, allow: bool) -> Result<(), RunError> {
    let path = dir.join(FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        if !now.arithmetic.is_empty() {
            eprintln!("warning: {} is missing (a run started before lockstep recorded it), so the resumed steps repeat the uninterrupted run only under the arithmetic it started with: runs started before 3436aa9 ran LOCKSTEP_BACKWARD_MATH=exact, the default since is fast", path.display());
        }
        return Ok(());
    };
    let before: Environment = match serde_json::from_str(&text) {
        Ok(before) => before,
        Err(e) if allow => {
            eprintln!("warning: {}: {e}; continuing unchecked (--allow-config-change)", path.display());
            return Ok(());
        }
        Err(e) => return Err(RunError::Other(format!("{}: {e}: the run's starting environment cannot be compared with this one; pass --allow-config-change to resume anyway", path.display()))),
    };
    for (name, was, is) in arithmetic_changes(&before, now) {
        let remedy = if is == NOT_USED { "resume on a device where it applies".to_string() } else { format!("set {name}={was}") };
        let message = format!("the run started with {was}, this process has {is} ({FILE}): the resumed steps' gradients would not have the uninterrupted run's bits. To continue it bit for bit {remedy}, or pass --allow-config-change");
        if !allow {
            return Err(RunError::Config(ConfigError::Environment { variable: name, message }));
        }
        eprintln!("warning: {name}: the run started with {was}, this process has {is}; continuing (--allow-config-change)");
    }
    if before.lockstep_revision != now.lockstep_revision {
        eprintln!("warning: the run started on lockstep {}, this binary is {}: the resumed steps repeat the uninterrupted run's bits only if no change between the two touched the arithmetic ({})", before.lockstep_revision, now.lockstep_revision, path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(revision: &str, math: Option<&str>) -> Environment {
        Environment { lockstep_revision: revision.into(), arithmetic: math.map(|m| ("LOCKSTEP_BACKWARD_MATH".to_string(), m.to_string())).into_iter().collect() }
    }

    #[test]
    fn a_resume_under_other_arithmetic_is_refused_naming_the_variable() {
        let dir = shared_kernels::testing::Scratch::new("run-environment");
        // the record round-trips, and this process resumes its own run
        save(&dir).unwrap();
        check_resume(&dir, false).unwrap();
        let recorded: Environment = serde_json::from_str(&std::fs::read_to_string(dir.join(FILE)).unwrap()).unwrap();
        assert_eq!(recorded, Environment::current().unwrap());
        // a run started with exact math, resumed with fast: refused with exit 2's error, naming the variable and the way back
        let text = serde_json::to_string(&env("abc1234", Some("exact"))).unwrap();
        std::fs::write(dir.join(FILE), text).unwrap();
        let err = check_resume_against(&dir, &env("abc1234", Some("fast")), false).unwrap_err();
        assert!(matches!(err, RunError::Config(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("environment variable `LOCKSTEP_BACKWARD_MATH`") && msg.contains("started with exact") && msg.contains("set LOCKSTEP_BACKWARD_MATH=exact") && msg.contains("--allow-config-change"), "{msg}");
        // allowed explicitly, or the same arithmetic on another build: continues (with warnings)
        check_resume_against(&dir, &env("abc1234", Some("fast")), true).unwrap();
        check_resume_against(&dir, &env("def5678", Some("exact")), false).unwrap();
        // a device where the variable does not apply says so rather than suggesting a value
        let msg = check_resume_against(&dir, &env("abc1234", None), false).unwrap_err().to_string();
        assert!(msg.contains("not used on this device") && msg.contains("resume on a device where it applies"), "{msg}");
        // an unreadable record is an error unless allowed; a missing one (an older run) is not
        std::fs::write(dir.join(FILE), "{").unwrap();
        assert!(check_resume_against(&dir, &env("abc1234", Some("fast")), false).unwrap_err().to_string().contains(FILE));
        check_resume_against(&dir, &env("abc1234", Some("fast")), true).unwrap();
        std::fs::remove_file(dir.join(FILE)).unwrap();
        check_resume_against(&dir, &env("abc1234", Some("fast")), false).unwrap();
    }

    #[test]
    fn only_differing_variables_are_changes() {
        assert!(arithmetic_changes(&env("a", Some("fast")), &env("b", Some("fast"))).is_empty());
        assert_eq!(arithmetic_changes(&env("a", Some("exact")), &env("a", Some("fast"))), vec![("LOCKSTEP_BACKWARD_MATH".to_string(), "exact".to_string(), "fast".to_string())]);
        assert_eq!(arithmetic_changes(&env("a", None), &env("a", Some("fast"))), vec![("LOCKSTEP_BACKWARD_MATH".to_string(), NOT_USED.to_string(), "fast".to_string())]);
    }
}
