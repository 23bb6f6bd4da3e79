//! A test's own folder under the system temp dir. It is removed when the test passes, so test
//! runs leave nothing behind (a developer's /tmp shares its disk with builds), and kept and
//! named on stderr when the test fails, for a look at what the run left.

use std::ops::Deref;
use std::path::{Path, PathBuf};

pub struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    /// A new empty folder named `lockstep-{name}-` and a random suffix (unique across
    /// concurrently running test processes).
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new().prefix(&format!("lockstep-{name}-")).tempdir().expect("create a scratch folder under the temp dir");
        Scratch(Some(dir))
    }

    pub fn path(&self) -> &Path {
        self.0.as_ref().expect("present until dropped").path()
    }

    pub fn to_path_buf(&self) -> PathBuf {
        self.path().to_path_buf()
    }
}

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!("the failed test's folder is kept: {}", dir.keep().display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn a_passing_tests_folder_is_removed_and_a_failing_tests_is_kept() {
        let s = Scratch::new("scratch-self-test");
        std::fs::write(s.join("f"), b"x").unwrap();
        let path = s.to_path_buf();
        drop(s);
        assert!(!path.exists(), "{} outlived its test", path.display());
        let kept = std::thread::spawn(|| {
            let s = Scratch::new("scratch-self-test-failing");
            let path = s.to_path_buf();
            let _guard = s;
            std::panic::panic_any(path);
        })
        .join()
        .unwrap_err();
        let path = kept.downcast::<std::path::PathBuf>().unwrap();
        assert!(path.exists(), "the failing test's folder was removed");
        std::fs::remove_dir_all(*path).unwrap();
    }
}
