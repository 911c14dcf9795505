//! How gleaner names things in a cluster's batch system, and how a kcm
//! starts a launcher.
//!
//! These names are a contract, not a detail: a restarted kcm recognises its
//! predecessor's placeholders and components by name alone, a launcher's id
//! names its queue, and tests, benchmarks and operators look for the same
//! names in `qstat`. So each is spelled here once, for the kcm that makes
//! them and for everyone who looks for them (without depending on the kcm).

use std::time::Duration;

use gleaner_manifest::JobId;

use crate::{ClusterName, LauncherId};

/// Name prefix of gleaner's placeholder jobs (`gl-<job>`).
pub const PLACEHOLDER_PREFIX: &str = "gl-";

/// Name prefix of grid job components (`gg-<job>.<n>`).
pub const COMPONENT_PREFIX: &str = "gg-";

/// The batch-system name of job `job`'s placeholders: `gl-<job>`.
pub fn placeholder_name(job: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{job}")
}

/// The gleaner job a placeholder's batch-system name belongs to.
pub fn parse_placeholder_name(name: &str) -> Option<JobId> {
    name.strip_prefix(PLACEHOLDER_PREFIX)?.parse().ok()
}

/// The batch-system name of a grid job's component: `gg-<job>.<n>`.
pub fn component_name(job: &JobId, component: u32) -> String {
    format!("{COMPONENT_PREFIX}{job}.{component}")
}

/// The job and component a batch job name belongs to, if it is a component.
pub fn parse_component_name(name: &str) -> Option<(JobId, u32)> {
    let (job, component) = name.strip_prefix(COMPONENT_PREFIX)?.rsplit_once('.')?;
    Some((job.parse().ok()?, component.parse().ok()?))
}

/// A launcher's id: `<cluster>-<batch id>`, unique across clusters because
/// batch ids are unique within one. `batch_id` is the placeholder's id in
/// the batch system (`4711.3`).
pub fn launcher_id(cluster: &ClusterName, batch_id: &str) -> LauncherId {
    LauncherId::new(launcher_id_word(cluster.as_str(), batch_id))
}

/// A launcher's id as a job script spells it, from how the script spells
/// the cluster's name (shell-quoted) and the batch id ([`SGE_TASK_ID`]):
/// the shell expands it to the [`launcher_id`].
pub fn launcher_id_word(cluster: &str, batch_id: &str) -> String {
    format!("{cluster}-{batch_id}")
}

/// The batch id inside a launcher id of `cluster`; `None` for another cluster's.
pub fn batch_id<'a>(cluster: &ClusterName, launcher: &'a LauncherId) -> Option<&'a str> {
    launcher
        .as_str()
        .strip_prefix(cluster.as_str())?
        .strip_prefix('-')
}

/// Whether two names are the same host: batch systems and `gethostname`
/// may disagree on the domain (`node1` against `node1.cluster.example`).
pub fn same_host(a: &str, b: &str) -> bool {
    !a.is_empty() && host_key(a) == host_key(b)
}

/// A host's name as [`same_host`] compares it: short and lowercase.
pub fn host_key(name: &str) -> String {
    name.split('.').next().unwrap_or(name).to_ascii_lowercase()
}

/// A Grid Engine array task's batch id as its job script sees it (shell
/// variables, expanded when the placeholder starts).
pub const SGE_TASK_ID: &str = "$JOB_ID.$SGE_TASK_ID";

/// A Slurm array task's batch id (`123_4`, as `squeue` shows it) as its
/// job script sees it.
pub const SLURM_TASK_ID: &str = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}";

/// The local backend's batch id of its `n`th child, a launcher: unique
/// across kcm restarts through the kcm's process id.
pub fn local_launcher_batch_id(kcm_pid: u32, n: u64) -> String {
    format!("l{kcm_pid}-{n}")
}

/// The local backend's batch id of its `n`th child, a grid component.
pub fn local_component_batch_id(kcm_pid: u32, n: u64) -> String {
    format!("c{kcm_pid}-{n}")
}

/// The `gleaner` subcommand that runs one launcher.
pub const LAUNCHER_SUBCOMMAND: &str = "launcher";

/// One launcher's own arguments, after [`LAUNCHER_SUBCOMMAND`]. Values are
/// used as given: a job script passes them shell-quoted, or as shell
/// variables.
#[derive(Debug, Clone, Copy)]
pub struct LauncherArgs<'a> {
    pub job: &'a str,
    pub cluster: &'a str,
    /// The launcher's id ([`launcher_id`]); names its queue.
    pub id: &'a str,
    /// The batch system's name for the slot, for the consumer tag.
    pub slot: &'a str,
    /// Slots it holds.
    pub slots: u32,
    /// Slots each task takes: it runs `slots / task_slots` at once.
    pub task_slots: u32,
    /// Memory and GPUs each task needs.
    pub task_needs: gleaner_manifest::Needs,
    /// The host's GPUs, for a launcher to claim its own from where the
    /// batch system does not assign them (empty: it does).
    pub gpu_devices: &'a [String],
    /// Open descriptors the launcher inherits, each a claim the kcm took on
    /// the device of `gpu_devices` in its place (the local backend):
    /// then those are its devices, and nobody else's to claim.
    pub gpu_claims: &'a [i32],
    /// The placeholder's walltime: the launcher drains before it ends.
    pub walltime: Option<Duration>,
    /// A shell word for the end the batch system gave the placeholder, in
    /// seconds since the epoch, where it may give less than the walltime
    /// asked (Slurm's `--time-min`); empty when it could not be read.
    pub ends_at: Option<&'a str>,
}

impl LauncherArgs<'_> {
    pub fn to_vec(&self) -> Vec<String> {
        let mut args = vec![
            "--job".to_owned(),
            self.job.to_owned(),
            "--cluster".to_owned(),
            self.cluster.to_owned(),
            "--id".to_owned(),
            self.id.to_owned(),
            "--slot".to_owned(),
            self.slot.to_owned(),
            "--slots".to_owned(),
            self.slots.to_string(),
        ];
        if self.task_slots > 1 {
            args.extend(["--task-slots".to_owned(), self.task_slots.to_string()]);
        }
        if self.task_needs.memory_mb > 0 {
            args.extend([
                "--task-memory".to_owned(),
                format!("{}M", self.task_needs.memory_mb),
            ]);
        }
        if self.task_needs.gpus > 0 {
            args.extend(["--task-gpus".to_owned(), self.task_needs.gpus.to_string()]);
            if !self.gpu_devices.is_empty() {
                args.extend(["--gpu-devices".to_owned(), self.gpu_devices.join(",")]);
            }
            if !self.gpu_claims.is_empty() {
                let fds: Vec<String> = self.gpu_claims.iter().map(i32::to_string).collect();
                args.extend(["--gpu-claims".to_owned(), fds.join(",")]);
            }
        }
        if let Some(walltime) = self.walltime {
            args.extend(["--walltime".to_owned(), format!("{}s", walltime.as_secs())]);
        }
        if let Some(ends_at) = self.ends_at {
            args.extend(["--ends-at".to_owned(), ends_at.to_owned()]);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back() {
        let job: JobId = "sweep-3fa9c2d41e07b5a8".parse().unwrap();
        assert_eq!(placeholder_name(job.as_str()), "gl-sweep-3fa9c2d41e07b5a8");
        assert_eq!(
            parse_placeholder_name("gl-sweep-3fa9c2d41e07b5a8"),
            Some(job.clone())
        );
        assert_eq!(parse_placeholder_name("gg-sweep-3fa9c2d41e07b5a8.1"), None);
        assert_eq!(component_name(&job, 2), "gg-sweep-3fa9c2d41e07b5a8.2");
        assert_eq!(
            parse_component_name("gg-sweep-3fa9c2d41e07b5a8.2"),
            Some((job, 2))
        );
        assert_eq!(parse_component_name("gl-sweep-3fa9c2d41e07b5a8"), None);
    }

    #[test]
    fn hosts_match_without_their_domain() {
        assert!(same_host("node1", "node1.grid.example"));
        assert!(same_host("Node1", "node1"));
        assert!(!same_host("node1", "node10"));
        assert!(!same_host("", ""), "an unknown host is no host");
    }

    #[test]
    fn launcher_ids_name_their_cluster() {
        let c1 = ClusterName::from("c1");
        let id = launcher_id(&c1, "4711.3");
        assert_eq!(id.as_str(), "c1-4711.3");
        assert_eq!(batch_id(&c1, &id), Some("4711.3"));
        assert_eq!(batch_id(&c1, &"c10-4711.3".into()), None);
        assert_eq!(batch_id(&"c2".into(), &id), None);
        assert_eq!(
            launcher_id_word("'c1'", SGE_TASK_ID),
            "'c1'-$JOB_ID.$SGE_TASK_ID"
        );
    }

    #[test]
    fn launcher_arguments_in_order() {
        let args = LauncherArgs {
            task_needs: Default::default(),
            gpu_devices: &[],
            gpu_claims: &[],
            job: "j",
            cluster: "c1",
            id: "c1-7",
            slot: "0",
            slots: 2,
            task_slots: 1,
            walltime: Some(Duration::from_secs(60)),
            ends_at: Some("\"$ends_at\""),
        };
        assert_eq!(
            args.to_vec().join(" "),
            "--job j --cluster c1 --id c1-7 --slot 0 --slots 2 --walltime 60s --ends-at \"$ends_at\""
        );
        let threaded = LauncherArgs {
            slots: 4,
            task_slots: 2,
            walltime: None,
            ends_at: None,
            ..args
        };
        assert_eq!(
            threaded.to_vec().join(" "),
            "--job j --cluster c1 --id c1-7 --slot 0 --slots 4 --task-slots 2"
        );
    }
}
