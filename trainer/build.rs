//! The lockstep commit this binary was built from, for a run's config.resolved.toml and its
//! checkpoints' state.json. Asking git when the run starts named whatever repository the user
//! ran it in (or "unknown" on a machine without the source, such as a GPU host).

use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| Command::new("git").args(args).current_dir(&dir).output().ok().filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let revision = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BUILD_GIT_REVISION={revision}");
    println!("cargo:rerun-if-changed=build.rs");
    // a new commit or checkout moves HEAD or a branch ref (only paths that exist: a missing
    // one would rerun this script on every build)
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for path in ["HEAD", "refs/heads", "packed-refs"] {
            let p = std::path::Path::new(&git_dir).join(path);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}
