//! The crate graph as the architecture has it: the services' cores and
//! the pure crates they share do no I/O, so none of them may depend,
//! even through another crate, on an async runtime, the broker's client,
//! system calls or another service's shell.

use std::process::Command;

/// Crates that hold decisions only.
const PURE: [&str; 7] = [
    "gleaner-manifest",
    "gleaner-protocol",
    "gleaner-policy",
    "gleaner-scheduler-core",
    "gleaner-runner-core",
    "gleaner-kcm-core",
    "gleaner-launcher-core",
];

/// Crates that do I/O: a runtime, the broker, processes and the system.
const IO: [&str; 15] = [
    "tokio",
    "tokio-util",
    "mio",
    "lapin",
    "nix",
    "procfs",
    "caps",
    "tempfile",
    "gleaner-broker",
    "gleaner-contain",
    "gleaner-kcm",
    "gleaner-launcher",
    "gleaner-runner",
    "gleaner-scheduler",
    "tiny_http",
];

/// Every crate `package` depends on, as `cargo tree` resolves them.
fn dependencies(package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-f",
            "{p}",
        ])
        .args(["-p", package])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo tree");
    assert!(
        output.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn cores_and_shared_crates_depend_on_nothing_that_does_io() {
    for package in PURE {
        let found = dependencies(package);
        assert!(found.iter().any(|p| p == package), "{package}: {found:?}");
        let io: Vec<&String> = found.iter().filter(|p| IO.contains(&p.as_str())).collect();
        assert!(io.is_empty(), "{package} depends on {io:?}");
    }
}
