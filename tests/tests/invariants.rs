//! ARCHITECTURE.md's crate-graph invariants, checked on the real dependency
//! graph (`cargo tree`, offline, normal and build edges: what each binary
//! links, not what its tests use).

use std::collections::BTreeSet;
use std::process::Command;

/// Every package `package` links (normal and build dependencies, all features
/// the workspace build enables), by name.
fn linked(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "-p", package, "-e", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}", "--all-features"])
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let names: BTreeSet<String> = text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect();
    assert!(names.contains(package), "cargo tree listed no {package}: {text}");
    names
}

fn assert_links_none(package: &str, forbidden: &[&str], why: &str) {
    let names = linked(package);
    let hits: Vec<&&str> = forbidden.iter().filter(|f| names.contains(**f)).collect();
    assert!(hits.is_empty(), "{package} links {hits:?}: {why}");
}

#[test]
fn the_miner_never_links_libtorch_or_the_servers() {
    assert_links_none(
        "edge-miner",
        &["torch-sys", "tch", "tributary-policy", "coordinator", "validator", "trainer", "redb"],
        "the miner is one small binary for consumer machines",
    );
}

#[test]
fn client_roles_never_link_the_coordinator() {
    for role in ["trainer", "validator"] {
        assert_links_none(role, &["coordinator", "redb", "axum"], "a rule two roles share lives in protocol/");
    }
}

#[test]
fn protocol_has_no_async_runtime_and_no_sockets() {
    assert_links_none(
        "tributary-protocol",
        &["tokio", "quinn", "rustls", "mio", "tributary-assets"],
        "protocol/ is pure functions and plain types; machine paths live in tributary-assets",
    );
}

/// The checker itself: it sees a dependency that is there.
#[test]
fn the_checker_sees_real_edges() {
    let names = linked("trainer");
    for dep in ["tributary-protocol", "tributary-policy", "torch-sys"] {
        assert!(names.contains(dep), "trainer should link {dep}: {names:?}");
    }
}
