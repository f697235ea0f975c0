//! What the C and the C++ tests share: where cargo put the build, a child process killed
//! when the test ends, and the check for the tools they need.

use std::path::{Path, PathBuf};
use std::process::Child;

/// A child killed when the test ends, pass or fail.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The target folder's profile directory, target/<profile> (where cargo put
/// libbusway_ffi.so and `busway`; this test binary is in its deps folder).
pub(crate) fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its path");
    exe.parent()
        .and_then(Path::parent)
        .expect("under target/<profile>/deps")
        .to_owned()
}

/// Whether every one of `tools` is on the PATH. Without them the test says how to install them
/// and passes, except under CI (`CI` set), where it fails: `.ci/run` installs them.
pub(crate) fn have(tools: &[&str]) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file()))
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!("{missing:?} missing: apt-get install gcc g++ cmake to run this test");
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    false
}
