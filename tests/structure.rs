//! The crate graph as the architecture has it: the services' cores and
//! the pure crates they share do no I/O, so none of them may depend,
//! even through another crate, on an async runtime, the broker's client,
//! system calls or another service's shell.

use std::process::Command;

/// Crates that hold decisions only, and the simulator, which drives the
/// cores on a simulated clock (it reads a workload and writes plots, with
/// the standard library).
const PURE: [&str; 8] = [
    "gleaner-manifest",
    "gleaner-protocol",
    "gleaner-policy",
    "gleaner-scheduler-core",
    "gleaner-runner-core",
    "gleaner-kcm-core",
    "gleaner-launcher-core",
    "gleaner-simulator",
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

/// Source files under `dir`, at any depth, but build output.
fn rust_files(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() && name != "target" && !name.to_string_lossy().starts_with('.') {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// A module a reader can hold: its code, before its unit tests (which sit
/// in a `tests` submodule file of their own when they are many), is at
/// most 1,000 lines. Integration tests are tests throughout.
#[test]
fn no_module_has_more_than_a_thousand_lines_of_code() {
    const MOST: usize = 1000;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the gleaner crate sits in the workspace");
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut big: Vec<String> = files
        .iter()
        .filter(|path| !path.starts_with(root.join("tests")) && !path.ends_with("tests.rs"))
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).ok()?;
            let code = text
                .lines()
                .take_while(|line| *line != "#[cfg(test)]")
                .count();
            (code > MOST).then(|| format!("{}: {code} lines", path.display()))
        })
        .collect();
    big.sort();
    assert!(
        big.is_empty(),
        "modules over {MOST} lines of code: {big:#?}"
    );
}

/// Every e2e test that takes the dev grid's Slurm or replicated-broker
/// lock is in the nextest group that runs such tests one at a time (a
/// test waiting for the lock would hold a test thread doing nothing), and
/// every test the groups name exists.
#[test]
fn tests_taking_a_shared_lock_are_in_its_test_group() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let config = std::fs::read_to_string(root.join(".config/nextest.toml")).expect("nextest.toml");
    let mut files = Vec::new();
    rust_files(&root.join("tests/e2e"), &mut files);
    let mut tests = Vec::new();
    for file in files {
        let module = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        let text = std::fs::read_to_string(&file).expect("test file");
        for body in text.split("#[test]").skip(1) {
            let name = body
                .split("fn ")
                .nth(1)
                .and_then(|rest| rest.split('(').next())
                .unwrap_or_default();
            let test = format!("{module}::{name}");
            for (lock, group_module) in [
                ("SlurmCluster::lock()", "slurm"),
                ("BrokerCluster::lock()", "replicated_broker"),
            ] {
                let listed = module == group_module || config.contains(&format!("test(={test})"));
                assert!(
                    !body.contains(lock) || listed,
                    "{test} takes {lock}: list it in .config/nextest.toml"
                );
            }
            tests.push(test);
        }
    }
    for listed in config.split("test(=").skip(1) {
        let name = listed.split(')').next().unwrap_or_default();
        assert!(
            tests.iter().any(|t| t == name),
            "{name} in .config/nextest.toml is no test"
        );
    }
}
