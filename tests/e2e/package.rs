//! The Debian package as an admin meets it: built by `deploy/deb/build.sh`
//! from this build's binary, installed with `dpkg -i` into a clean Debian
//! 12 root that `deploy/deb/chroot.sh` makes, `gleaner doctor` there on the
//! configuration as shipped, and the units' commands started there as the
//! units say (user, environment, credentials) against this test's broker.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use gleaner_testkit::{by_task, finish_all_succeeded};

use crate::{MINUTE, gleaner};

/// The repository's root (the e2e tests live in the `gleaner` crate).
pub(crate) fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn succeeded(output: Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what}: {text}");
    text
}

/// A command in the clean root, in a mount namespace of its own with
/// `/proc` and the cgroup tree (gone with its last process), as `user`.
fn in_root(root: &Path, user: Option<&str>, env: &[(String, String)], args: &[&str]) -> Command {
    let root = root.display();
    let mut script = format!(
        "set -e; mount -t proc proc {root}/proc; mount -t sysfs sys {root}/sys; \
         mount -t cgroup2 cgroup2 {root}/sys/fs/cgroup; exec chroot"
    );
    if let Some(user) = user {
        script.push_str(&format!(" --userspec={user}:{user}"));
    }
    script.push_str(&format!(
        " {root} env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin"
    ));
    for (key, value) in env {
        script.push_str(&format!(" {key}={}", shell_words::quote(value)));
    }
    for arg in args {
        script.push_str(&format!(" {}", shell_words::quote(arg)));
    }
    let mut command = Command::new("unshare");
    command.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    command
}

/// A unit file's settings (the last of each key).
fn unit(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn the_debian_package_installs_in_a_clean_root_and_its_units_run_a_job() {
    let mut g = gleaner("package");
    let repository = repository();
    let debs = g.path().join("debs");
    succeeded(
        Command::new(repository.join("deploy/deb/build.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_gleaner"), "--out"])
            .arg(&debs)
            .output()
            .expect("deploy/deb/build.sh"),
        "building the package",
    );
    let deb = std::fs::read_dir(&debs)
        .expect("the package's directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb");
    let root = g.path().join("root");
    succeeded(
        Command::new(repository.join("deploy/deb/chroot.sh"))
            .arg(&root)
            .output()
            .expect("deploy/deb/chroot.sh"),
        "making a clean root",
    );
    std::fs::copy(&deb, root.join("tmp/gleaner.deb")).expect("the package in the root");
    succeeded(
        in_root(&root, None, &[], &["dpkg", "-i", "/tmp/gleaner.deb"])
            .output()
            .expect("dpkg"),
        "dpkg -i",
    );

    // What it installed: the service account, a configuration only root
    // reads (a conffile), the man pages, the book, the units.
    let account = succeeded(
        in_root(&root, None, &[], &["getent", "passwd", "gleaner"])
            .output()
            .expect("getent"),
        "the service account",
    );
    assert!(account.contains("/usr/sbin/nologin"), "{account}");
    let config = root.join("etc/gleaner/gleaner.toml");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&config)
            .expect("the configuration")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let conffiles = succeeded(
        in_root(
            &root,
            None,
            &[],
            &["dpkg-query", "-W", "-f", "${Conffiles}", "gleaner"],
        )
        .output()
        .expect("dpkg-query"),
        "the package's conffiles",
    );
    assert!(
        conffiles.contains("/etc/gleaner/gleaner.toml"),
        "{conffiles}"
    );
    let man = root.join("usr/share/man/man1");
    for page in ["gleaner.1", "gleaner-submit.1", "gleaner-doctor.1"] {
        assert!(
            man.join(page).exists() || man.join(format!("{page}.gz")).exists(),
            "no man page {page}"
        );
    }
    // The book beside README, whose links lead into it.
    let doc = root.join("usr/share/doc/gleaner");
    for page in [
        "README.md",
        "DESIGN.md",
        "docs/src/manifest.md",
        "docs/src/SUMMARY.md",
    ] {
        assert!(
            doc.join(page).exists() || doc.join(format!("{page}.gz")).exists(),
            "no {page} in /usr/share/doc/gleaner"
        );
    }

    // `gleaner doctor` on the configuration as shipped: its broker account
    // is a placeholder, which the broker refuses; doctor says so and how
    // to fix it, and exits 1.
    let doctor = in_root(&root, None, &[], &["gleaner", "doctor"])
        .output()
        .expect("doctor");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&doctor.stdout),
        String::from_utf8_lossy(&doctor.stderr)
    );
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    assert!(
        said.contains("refused") && said.contains("broker_url"),
        "doctor names the broker account and its fix:\n{said}"
    );

    // Configured for this test's broker, the units' commands run a job.
    std::fs::write(
        &config,
        format!(
            "broker_url = \"{}\"\n[users]\nsingle = true\n[runner]\nresults_root = \"/var/lib/gleaner/results\"\n\
             [launcher]\nidle_timeout = \"2s\"\n[[cluster]]\nname = \"local\"\nbackend = \"local\"\nslots = 2\n",
            g.vhost.url()
        ),
    )
    .expect("the configuration");
    for name in ["gleaner-scheduler", "gleaner-runner", "gleaner-kcm@local"] {
        let file = name.replace("@local", "@");
        let settings = unit(&root.join(format!("usr/lib/systemd/system/{file}.service")));
        let credentials = format!("/run/credentials/{name}.service");
        if let Some((credential, source)) = settings
            .get("LoadCredential")
            .and_then(|c| c.split_once(':'))
        {
            let into = root.join(credentials.trim_start_matches('/'));
            std::fs::create_dir_all(&into).expect("credentials directory");
            std::fs::copy(
                root.join(source.trim_start_matches('/')),
                into.join(credential),
            )
            .expect("a credential");
            succeeded(
                in_root(&root, None, &[], &["chown", "-R", "gleaner", &credentials])
                    .output()
                    .expect("chown"),
                "the credential is the service's",
            );
        }
        let env: Vec<(String, String)> = settings
            .get("Environment")
            .into_iter()
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.replace("%d", &credentials)))
            .collect();
        let exec = settings["ExecStart"].replace("%i", "local");
        let args: Vec<&str> = exec.split_whitespace().collect();
        let user = settings
            .get("User")
            .map(String::as_str)
            .filter(|u| *u != "root");
        g.start_command(name, in_root(&root, user, &env, &args));
    }
    let waiting = g.client(&[
        "submit",
        g.write(
            "sweep.toml",
            "name = \"packaged\"\n[sweep]\ncommand = \"echo {n}\"\nparams = { n = { from = 1, to = 4 } }\n",
        )
        .to_str()
        .expect("path"),
        "--wait",
    ]);
    let output = finish_all_succeeded(waiting, 4, 3 * MINUTE);
    let job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let results = root.join("var/lib/gleaner/results/results").join(&job);
    let index = std::fs::read_to_string(results.join("index.jsonl"))
        .expect("the job's index where the package's runner keeps results");
    let lines: Vec<serde_json::Value> = index
        .lines()
        .map(|l| serde_json::from_str(l).expect("index line"))
        .collect();
    assert_eq!(by_task(&lines).len(), 4);
    let scheduler = g.log("gleaner-scheduler");
    assert!(scheduler.contains("scheduler active"), "{scheduler}");
    let kcm = g.log("gleaner-kcm@local");
    assert!(!kcm.contains("no cgroups"), "{kcm}");
    g.stop_services(MINUTE);
    std::fs::remove_dir_all(&root).expect("the root goes");
}
