//! Configuration: `--config`, `$GLEANER_CONFIG`, `./gleaner.toml`,
//! `~/.config/gleaner/gleaner.toml`, `/etc/gleaner/gleaner.toml` (the first
//! there is), then `GLEANER_*` environment variables
//! (`GLEANER_BROKER_URL`, `GLEANER_RUNNER__RESULTS_ROOT`, …) on top.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use gleaner_kcm::{ClusterConfig, ClusterSettings, KcmConfig};
use gleaner_launcher::LauncherSettings;
use gleaner_policy::access::Users;
use gleaner_protocol::ClusterName;
use gleaner_runner::RunnerConfig;
use gleaner_scheduler::SchedulerConfig;
use serde::{Deserialize, Serialize};

/// Environment variables of the `GLEANER_` family that are not settings:
/// where the file is, and what launchers tell their tasks (a task, a final
/// step above all, may run `"$GLEANER_BIN" logs` in that environment).
const NOT_SETTINGS: &[&str] = &[
    "CONFIG",
    "JOB",
    "TASK",
    "ATTEMPT",
    "SANDBOX",
    "SLOTS",
    "GPUS",
    "CHECKPOINT",
    "CHECKPOINT_MAX_BYTES",
    "BIN",
    "RESULTS",
    "FINAL",
];
/// The prefix of a task's parameters in its environment.
const PARAM_PREFIX: &str = "PARAM_";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The broker, when it has one address.
    pub broker_url: String,
    /// The broker's addresses when it is a cluster: components connect to
    /// any of them and move to another when theirs fails. Replaces
    /// `broker_url`.
    pub broker_urls: Vec<String>,
    pub scheduler: SchedulerConfig,
    pub runner: RunnerConfig,
    pub launcher: LauncherSettings,
    /// Who the users are, and who of them are admins.
    pub users: Users,
    #[serde(rename = "cluster")]
    pub clusters: Vec<ClusterConfig>,
    /// The file these settings came from, if any (passed on to launchers).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            broker_url: gleaner_broker::DEFAULT_URL.to_owned(),
            broker_urls: Vec::new(),
            scheduler: SchedulerConfig::default(),
            runner: RunnerConfig::default(),
            launcher: LauncherSettings::default(),
            users: Users::default(),
            clusters: Vec::new(),
            source: None,
        }
    }
}

/// A name for the gleaner a broker URL serves (its host and vhost), so that
/// two deployments on one host never share a kcm's spool directory.
fn deployment(broker_url: &str) -> String {
    let rest = broker_url
        .split_once("://")
        .map_or(broker_url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let rest = rest.split('?').next().unwrap_or(rest);
    let (host, vhost) = rest.split_once('/').unwrap_or((rest, ""));
    let vhost = match vhost {
        "" | "%2f" | "%2F" => "default",
        other => other,
    };
    format!("{host}-{vhost}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
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
                // An empty table by default is a map of free keys
                // (`users.accounts`), not a section.
                Some(known) if known.as_object().is_some_and(serde_json::Map::is_empty) => {
                    Vec::new()
                }
                Some(known) => unknown_keys(value, known, &path),
                None => vec![path],
            }
        })
        .collect()
}

/// Settings from `GLEANER_*` variables: `__` separates sections, lists are
/// comma-separated.
fn environment_source(environment: config::Map<String, String>) -> config::Environment {
    config::Environment::with_prefix("GLEANER")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .list_separator(",")
        .with_list_parse_key("broker_urls")
        .source(Some(environment))
}

/// The `GLEANER_*` environment variables that override settings, as set
/// for this process; launchers on other nodes are given the same.
pub fn environment_overrides() -> Vec<(String, String)> {
    overrides(std::env::vars())
}

fn overrides(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.filter(|(key, _)| {
        key.strip_prefix("GLEANER_")
            .is_some_and(|rest| !NOT_SETTINGS.contains(&rest) && !rest.starts_with(PARAM_PREFIX))
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
            None => {
                // The user's own (`deploy/rabbitmq/user.sh add` writes
                // their broker account there) before the system's.
                let own = std::env::var_os("XDG_CONFIG_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
                    .map(|dir| dir.join("gleaner/gleaner.toml"));
                [
                    Some(PathBuf::from("gleaner.toml")),
                    own,
                    Some(PathBuf::from("/etc/gleaner/gleaner.toml")),
                ]
                .into_iter()
                .flatten()
                .find(|p| p.is_file())
            }
        };
        let mut builder = config::Config::builder();
        if let Some(path) = &file {
            builder = builder
                .add_source(config::File::from(path.as_path()).format(config::FileFormat::Toml));
        }
        let environment: config::Map<String, String> =
            environment_overrides().into_iter().collect();
        builder = builder.add_source(environment_source(environment));
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
        Ok(settings.resolved())
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
        if !self.broker_urls.is_empty()
            && self.broker_url != gleaner_broker::DEFAULT_URL
            && !self.broker_urls.contains(&self.broker_url)
        {
            bail!("broker_url is not one of broker_urls: set one or the other");
        }
        if !(0.0..=1.0).contains(&self.scheduler.state.policy.load_cap) {
            bail!("scheduler.load_cap must be between 0 and 1");
        }
        let intervals = [
            ("scheduler.round_interval", self.scheduler.round_interval),
            ("scheduler.stale_after", self.scheduler.state.stale_after),
            (
                "scheduler.grant_timeout",
                self.scheduler.state.grant_timeout,
            ),
            (
                "scheduler.probe_interval",
                self.scheduler.state.probe_interval,
            ),
            (
                "scheduler.reservation_timeout",
                self.scheduler.state.grid.reservation_timeout,
            ),
            ("runner.heartbeat", self.runner.job.heartbeat),
            ("launcher.heartbeat", self.launcher.heartbeat),
            ("launcher.idle_timeout", self.launcher.idle_timeout),
        ];
        for (key, interval) in intervals {
            if interval.is_zero() {
                bail!("{key} must be longer than 0s");
            }
        }
        if !(0..=19).contains(&self.launcher.limits.nice) {
            bail!(
                "launcher.task_nice must be between 0 and 19: tasks never run ahead of their launcher"
            );
        }
        for cluster in &self.clusters {
            cluster.validate().map_err(anyhow::Error::msg)?;
            // The scheduler gives a cluster it has not heard from for
            // `stale_after` nothing: an idle kcm reports well within it.
            if cluster.idle_poll().saturating_mul(2) > self.scheduler.state.stale_after {
                bail!(
                    "cluster {}: idle_poll_interval must be at most half of scheduler.stale_after",
                    cluster.name
                );
            }
        }
        Ok(())
    }

    /// Settings that follow from others, copied here once: the runner
    /// judges the silence of a launcher that does not say its heartbeat by
    /// the launchers' setting.
    fn resolved(mut self) -> Self {
        self.runner.job.launcher_heartbeat = self.launcher.heartbeat;
        self
    }

    /// The broker's addresses, one or several.
    pub fn broker_urls(&self) -> Vec<String> {
        if self.broker_urls.is_empty() {
            vec![self.broker_url.clone()]
        } else {
            self.broker_urls.clone()
        }
    }

    /// The broker user these settings log in as.
    pub fn broker_user(&self) -> String {
        gleaner_broker::Broker::new(&self.broker_urls(), "cli")
            .map(|broker| broker.user().to_owned())
            .unwrap_or_default()
    }

    /// The deployment's name: the same whichever order its broker's
    /// addresses are listed in.
    fn deployment(&self) -> String {
        self.broker_urls()
            .iter()
            .map(|url| deployment(url))
            .min()
            .unwrap_or_default()
    }

    /// The kcm of `cluster`: its settle time follows from the runners'
    /// preempt grace, its default spool directory from the deployment.
    pub fn kcm(&self, cluster: &ClusterConfig) -> KcmConfig {
        let spool = std::env::temp_dir()
            .join("gleaner-kcm")
            .join(self.deployment())
            .join(cluster.name.as_str());
        let mut kcm = cluster.kcm(self.runner.job.preempt_grace, spool);
        kcm.core.users = self.users.clone();
        kcm
    }

    pub fn cluster(&self, name: &ClusterName) -> anyhow::Result<&ClusterConfig> {
        self.clusters
            .iter()
            .find(|c| &c.name == name)
            .with_context(|| {
                let name = name.as_str();
                format!("no [[cluster]] named {name:?} in the configuration")
            })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gleaner_policy::share::CsPolicy;

    use super::*;

    #[test]
    fn deployments_are_told_apart_by_host_and_vhost() {
        assert_eq!(
            deployment(gleaner_broker::DEFAULT_URL),
            "127.0.0.1_5672-default"
        );
        assert_eq!(
            deployment("amqp://u:p@broker:5672/science?heartbeat=10"),
            "broker_5672-science"
        );
        assert_ne!(deployment("amqp://h/a"), deployment("amqp://h/b"));
    }

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
poll_interval = "250ms"

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
        assert_eq!(settings.runner.job.heartbeat, Duration::from_secs(3));
        assert_eq!(settings.launcher.idle_timeout, Duration::from_secs(10));
        assert_eq!(
            settings.cluster(&"c1".into()).unwrap().busy_poll(),
            Duration::from_millis(250)
        );
        assert_eq!(
            settings.cluster(&"c2".into()).unwrap().h_rt,
            Some(Duration::from_secs(3600))
        );
        assert!(settings.cluster(&"c3".into()).is_err());
    }

    #[test]
    fn a_tasks_environment_is_no_setting() {
        let task = [
            ("GLEANER_JOB", "j-1"),
            ("GLEANER_GPUS", ""),
            ("GLEANER_SLOTS", "1"),
            ("GLEANER_BIN", "/usr/bin/gleaner"),
            ("GLEANER_RESULTS", "/r"),
            ("GLEANER_FINAL", "1"),
            ("GLEANER_CHECKPOINT_MAX_BYTES", "1024"),
            ("GLEANER_PARAM_seed", "3"),
            ("GLEANER_RUNNER__MAX_JOBS", "7"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let kept = overrides(task.into_iter());
        assert_eq!(
            kept,
            [("GLEANER_RUNNER__MAX_JOBS".to_owned(), "7".to_owned())]
        );
        let settings: Settings = config::Config::builder()
            .add_source(environment_source(kept.into_iter().collect()))
            .build()
            .and_then(config::Config::try_deserialize)
            .unwrap();
        assert_eq!(settings.runner.max_jobs, 7);
    }

    #[test]
    fn environment_variables_override() {
        let environment: config::Map<String, String> = [
            ("GLEANER_BROKER_URL".to_owned(), "amqp://x/v".to_owned()),
            ("GLEANER_RUNNER__MAX_JOBS".to_owned(), "7".to_owned()),
            (
                "GLEANER_BROKER_URLS".to_owned(),
                "amqp://a/v,amqp://b/v".to_owned(),
            ),
        ]
        .into();
        let settings: Settings = config::Config::builder()
            .add_source(environment_source(environment))
            .build()
            .and_then(config::Config::try_deserialize)
            .unwrap();
        assert_eq!(settings.broker_url, "amqp://x/v");
        assert_eq!(settings.broker_urls, ["amqp://a/v", "amqp://b/v"]);
        assert_eq!(settings.runner.max_jobs, 7);
        assert!(
            settings.validate().is_err(),
            "broker_url not in broker_urls"
        );
    }

    #[test]
    fn mistakes_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        let cases = [
            ("[runner]\nheartbeet = \"1s\"\n", "heartbeet"),
            ("[scheduler]\nload_cup = 0.5\n", "scheduler.load_cup"),
            (
                "[scheduler]\nplacement_weights = { hi = 1 }\n",
                "placement_weights.hi",
            ),
            (
                "[scheduler]\nstale_after = \"0s\"\n",
                "scheduler.stale_after",
            ),
            ("[launcher]\ntask_nice = -5\n", "launcher.task_nice"),
        ];
        for (text, named) in cases {
            std::fs::write(&path, text).unwrap();
            let err = format!("{:#}", Settings::load(Some(&path)).unwrap_err());
            assert!(err.contains(named), "{err}");
        }
        std::fs::write(
            &path,
            "[[cluster]]\nname = \"a b\"\nbackend = \"local\"\nslots = 1\n",
        )
        .unwrap();
        assert!(Settings::load(Some(&path)).is_err());
        assert!(Settings::load(Some(&dir.path().join("missing.toml"))).is_err());
    }
}
