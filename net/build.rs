//! Stamps the git commit into [`tributary_net::cli::version`]: the
//! `TRIBUTARY_GIT_COMMIT` environment variable when set (`scripts/release.sh`
//! sets it), else `git rev-parse` in this checkout, else `unknown` (a source
//! tarball without `.git`). It reruns when that variable changes, not on every
//! commit (each rerun rebuilds every crate above this one): an incremental
//! build may keep an older commit; a clean build and a release are exact.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TRIBUTARY_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let from_env = std::env::var("TRIBUTARY_GIT_COMMIT").ok().filter(|c| !c.trim().is_empty());
    let commit = from_env.or_else(git_commit).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=TRIBUTARY_GIT_COMMIT={}", commit.trim());
}

/// The checkout's commit, only if this crate's workspace is the checkout's
/// root (not a tarball unpacked inside some other repository).
fn git_commit() -> Option<String> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let root = Path::new(&manifest).parent()?;
    if !root.join(".git").exists() {
        return None;
    }
    let out = Command::new("git").arg("-C").arg(root).args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|c| !c.is_empty())
}
