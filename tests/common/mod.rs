//! Shared by the tests that run example binaries.

use std::path::PathBuf;
use std::process::Command;

/// The path of example `name` in this test's profile directory, built first if it is missing
/// (`cargo test` builds examples, but `cargo test --test X` does not).
pub fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("test binary path");
    let profile_dir = deps
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let exe = profile_dir.join("examples").join(name);
    if !exe.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--example", name]);
        if profile_dir.ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building example {name} failed");
    }
    assert!(exe.exists(), "{} missing after building it", exe.display());
    exe
}
