//! Configuration: `--config`, `$GLEANER_CONFIG`, `./gleaner.toml`,
//! `/etc/gleaner/gleaner.toml`, then `GLEANER_*` environment variables
//! (`GLEANER_BROKER_URL`, `GLEANER_RUNNER__RESULTS_ROOT`, …) on top.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use gleaner_scheduler::SchedulerConfig;
use serde::{Deserialize, Serialize};

/// Environment variables of the `GLEANER_` family that are not settings:
/// where the file is, and what launchers tell their tasks.
const NOT_SETTINGS: &[&str] = &["CONFIG", "JOB", "TASK", "ATTEMPT", "SANDBOX"];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub broker_url: String,
    pub scheduler: SchedulerConfig,
    pub runner: RunnerSettings,
    pub launcher: LauncherSettings,
    #[serde(rename = "cluster")]
    pub clusters: Vec<ClusterSettings>,
    /// The file these settings came from, if any (passed on to launchers).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            broker_url: gleaner_broker::DEFAULT_URL.to_owned(),
            scheduler: SchedulerConfig::default(),
            runner: RunnerSettings::default(),
            launcher: LauncherSettings::default(),
            clusters: Vec::new(),
            source: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunnerSettings {
    /// Relative `results` paths of manifests are resolved against this.
    pub results_root: PathBuf,
    pub max_jobs: u16,
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    #[serde(with = "humantime_serde")]
    pub preempt_grace: Duration,
}

impl Default for RunnerSettings {
    fn default() -> Self {
        Self {
            results_root: PathBuf::from("."),
            max_jobs: 64,
            heartbeat: Duration::from_secs(2),
            preempt_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LauncherSettings {
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Where task sandboxes are made.
    pub scratch: PathBuf,
    /// Bytes kept of each task's stdout and stderr (the tail).
    pub max_stream_bytes: usize,
    /// Bytes kept of each declared output file.
    pub max_file_bytes: usize,
    /// Bytes of output files per task in all.
    pub max_outputs_bytes: usize,
    /// Between SIGTERM and SIGKILL when a task's walltime ends.
    #[serde(with = "humantime_serde")]
    pub kill_grace: Duration,
    /// How long before its placeholder's walltime a launcher preempts its
    /// own tasks (they are republished, not lost to the batch system's kill).
    #[serde(with = "humantime_serde")]
    pub deadline_margin: Duration,
}

impl Default for LauncherSettings {
    fn default() -> Self {
        let limits = gleaner_launcher::Limits::default();
        Self {
            idle_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(2),
            scratch: std::env::temp_dir().join("gleaner"),
            max_stream_bytes: limits.stream_bytes,
            max_file_bytes: limits.file_bytes,
            max_outputs_bytes: limits.outputs_bytes,
            kill_grace: limits.kill_grace,
            deadline_margin: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Local,
    Sge,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    pub name: String,
    pub backend: BackendKind,
    /// `local`: slots of the cluster (tasks that may run at once).
    #[serde(default)]
    pub slots: Option<u32>,
    /// Slots of each launcher: 1 is a launcher per core; more is one per node.
    #[serde(default = "one")]
    pub launcher_slots: u32,
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// `sge`: the cluster queue placeholders go to.
    #[serde(default)]
    pub queue: Option<String>,
    /// `sge`: walltime of each placeholder (`-l h_rt`).
    #[serde(default, with = "humantime_serde")]
    pub h_rt: Option<Duration>,
    /// `sge`: where placeholders' output goes (discarded when unset).
    #[serde(default)]
    pub log_dir: Option<PathBuf>,
    /// How long a batch-system command may take before it counts as failed.
    #[serde(default = "default_command_timeout", with = "humantime_serde")]
    pub command_timeout: Duration,
    /// Where grid job components leave their output and exit status; the
    /// cluster's nodes must see it (default: a directory under the system's
    /// temporary directory).
    #[serde(default)]
    pub spool_dir: Option<PathBuf>,
}

fn one() -> u32 {
    1
}

fn default_command_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

/// Keys of `given` that `known` does not have, as dotted paths. Lists (the
/// clusters) check their own keys when they are deserialized.
fn unknown_keys(given: &serde_json::Value, known: &serde_json::Value, prefix: &str) -> Vec<String> {
    let (Some(given), Some(known)) = (given.as_object(), known.as_object()) else {
        return Vec::new();
    };
    given
        .iter()
        .flat_map(|(key, value)| {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match known.get(key) {
                Some(known) => unknown_keys(value, known, &path),
                None => vec![path],
            }
        })
        .collect()
}

/// The `GLEANER_*` environment variables that override settings, as set
/// for this process; launchers on other nodes are given the same.
pub fn environment_overrides() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(key, _)| {
            key.strip_prefix("GLEANER_")
                .is_some_and(|rest| !NOT_SETTINGS.contains(&rest))
        })
        .collect()
}

impl Settings {
    /// Loads the settings. An explicitly named file must exist; the default
    /// locations are used only when present.
    pub fn load(explicit: Option<&Path>) -> anyhow::Result<Self> {
        let from_env = std::env::var_os("GLEANER_CONFIG").map(PathBuf::from);
        let file = match explicit.map(Path::to_path_buf).or(from_env) {
            Some(path) => {
                if !path.is_file() {
                    bail!("config file {} does not exist", path.display());
                }
                Some(path)
            }
            None => ["gleaner.toml", "/etc/gleaner/gleaner.toml"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file()),
        };
        let mut builder = config::Config::builder();
        if let Some(path) = &file {
            builder = builder
                .add_source(config::File::from(path.as_path()).format(config::FileFormat::Toml));
        }
        let environment: config::Map<String, String> =
            environment_overrides().into_iter().collect();
        builder = builder.add_source(
            config::Environment::with_prefix("GLEANER")
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(environment)),
        );
        let where_from = file
            .as_ref()
            .map_or_else(|| "environment".to_owned(), |p| p.display().to_string());
        let tree = builder
            .build()
            .with_context(|| format!("invalid configuration ({where_from})"))?;
        let mut settings = Self::from_tree(tree)
            .with_context(|| format!("invalid configuration ({where_from})"))?;
        settings.source = file.map(|p| std::path::absolute(&p).unwrap_or(p));
        settings.validate()?;
        Ok(settings)
    }

    /// Settings from a configuration tree. Library settings are flattened
    /// into their sections (serde cannot deny unknown keys there), so a key
    /// is unknown when the defaults, written out, do not have it.
    fn from_tree(tree: config::Config) -> anyhow::Result<Self> {
        let given: serde_json::Value = tree.clone().try_deserialize()?;
        let known = serde_json::to_value(Self::default())?;
        if let Some(key) = unknown_keys(&given, &known, "").into_iter().next() {
            bail!("unknown setting `{key}`");
        }
        Ok(tree.try_deserialize()?)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.scheduler.state.policy.load_cap) {
            bail!("scheduler.load_cap must be between 0 and 1");
        }
        let intervals = [
            ("scheduler.round_interval", self.scheduler.round_interval),
            ("runner.heartbeat", self.runner.heartbeat),
            ("launcher.heartbeat", self.launcher.heartbeat),
            ("launcher.idle_timeout", self.launcher.idle_timeout),
        ]
        .into_iter()
        .chain(
            self.clusters
                .iter()
                .map(|c| ("cluster.poll_interval", c.poll_interval)),
        );
        for (key, interval) in intervals {
            if interval.is_zero() {
                bail!("{key} must be longer than 0s");
            }
        }
        for cluster in &self.clusters {
            let valid = !cluster.name.is_empty()
                && cluster
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !valid {
                bail!(
                    "cluster name {:?} must be made of A-Z a-z 0-9 . _ -",
                    cluster.name
                );
            }
            match cluster.backend {
                BackendKind::Local if cluster.slots.is_none() => {
                    bail!("cluster {}: the local backend needs `slots`", cluster.name)
                }
                BackendKind::Sge if cluster.queue.is_none() => {
                    bail!("cluster {}: the sge backend needs `queue`", cluster.name)
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn cluster(&self, name: &str) -> anyhow::Result<&ClusterSettings> {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .with_context(|| format!("no [[cluster]] named {name:?} in the configuration"))
    }
}

#[cfg(test)]
mod tests {
    use gleaner_policy::share::CsPolicy;

    use super::*;

    #[test]
    fn a_full_file_parses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        std::fs::write(
            &path,
            r#"
broker_url = "amqp://u:p@h:5672/v"
[scheduler]
policy = "grid-equipartition"
load_cap = 0.5
placement_weights = { super-high = 8, high = 2, low = 1 }
max_tries = 100
[runner]
results_root = "/data"
heartbeat = "3s"
[launcher]
idle_timeout = "10s"
[[cluster]]
name = "c1"
backend = "local"
slots = 4
poll_interval = "500ms"

[[cluster]]
name = "c2"
backend = "sge"
queue = "c2.q"
h_rt = "1h"
"#,
        )
        .unwrap();
        let settings = Settings::load(Some(&path)).unwrap();
        let state = &settings.scheduler.state;
        assert_eq!(state.policy.policy, CsPolicy::GridEquipartition);
        assert_eq!(state.grid.weights.super_high, 8);
        assert_eq!(state.grid.max_tries, 100);
        assert_eq!(settings.runner.heartbeat, Duration::from_secs(3));
        assert_eq!(settings.launcher.idle_timeout, Duration::from_secs(10));
        assert_eq!(
            settings.cluster("c1").unwrap().poll_interval,
            Duration::from_millis(500)
        );
        assert_eq!(
            settings.cluster("c2").unwrap().h_rt,
            Some(Duration::from_secs(3600))
        );
        assert!(settings.cluster("c3").is_err());
    }

    #[test]
    fn environment_variables_override() {
        let environment: config::Map<String, String> = [
            ("GLEANER_BROKER_URL".to_owned(), "amqp://x/v".to_owned()),
            ("GLEANER_RUNNER__MAX_JOBS".to_owned(), "7".to_owned()),
        ]
        .into();
        let settings: Settings = config::Config::builder()
            .add_source(
                config::Environment::with_prefix("GLEANER")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(environment)),
            )
            .build()
            .and_then(config::Config::try_deserialize)
            .unwrap();
        assert_eq!(settings.broker_url, "amqp://x/v");
        assert_eq!(settings.runner.max_jobs, 7);
    }

    #[test]
    fn mistakes_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        std::fs::write(&path, "[runner]\nheartbeet = \"1s\"\n").unwrap();
        let err = format!("{:#}", Settings::load(Some(&path)).unwrap_err());
        assert!(err.contains("heartbeet"), "{err}");
        std::fs::write(&path, "[scheduler]\nload_cup = 0.5\n").unwrap();
        let err = format!("{:#}", Settings::load(Some(&path)).unwrap_err());
        assert!(err.contains("scheduler.load_cup"), "{err}");
        std::fs::write(&path, "[scheduler]\nplacement_weights = { hi = 1 }\n").unwrap();
        let err = format!("{:#}", Settings::load(Some(&path)).unwrap_err());
        assert!(err.contains("placement_weights.hi"), "{err}");
        std::fs::write(
            &path,
            "[[cluster]]\nname = \"a b\"\nbackend = \"local\"\nslots = 1\n",
        )
        .unwrap();
        assert!(Settings::load(Some(&path)).is_err());
        assert!(Settings::load(Some(&dir.path().join("missing.toml"))).is_err());
    }
}
