//! Slurm: launchers as placeholder array jobs.
//!
//! `sbatch` submits `m` launchers as one array job named `gl-<job>` in the
//! cluster's partition (with its QOS, account and nice value when set),
//! each on one node with `--cpus-per-task` of its slots, `--no-requeue`
//! (gleaner, not Slurm, decides what runs again) and a USR1 before its time
//! limit or at preemption, and none of the kcm's environment
//! (`--export=NONE`: the job script sets what the launcher needs).
//! `squeue` is read on every poll, `sinfo` only when where jobs run has
//! changed since its last reading, or that reading is 30 s old: each is
//! two RPCs to `slurmctld`, which every user of the cluster shares;
//! placeholders and components are recognised by their name and their
//! owner (the kcm's core judges: `core::KcmCore`), so a restarted kcm
//! adopts what its predecessor left, and nobody else's job named like them.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gleaner_manifest::{JobId, Needs, TaskShape};
use gleaner_protocol::{
    ClusterName, ComponentSpec,
    naming::{SLURM_TASK_ID, component_name, placeholder_name},
};

use crate::{
    backend::RunAs,
    backend::{
        Backend, BackendError, ComponentFiles, ComponentHosts, GivenEnd, LauncherCommand,
        PlaceholderTime, as_account, placeholder_needs, remove_all, run, submit_arrays,
    },
    contain::Account,
    snapshot::Snapshot,
    squeue::{self, SINFO_FIELDS, squeue_format},
};

/// Prints, in a placeholder's script, the end Slurm gave it (seconds since
/// the epoch): started in a hole, its limit may be anything from
/// `--time-min` to `--time`. Only its own line: an array's last task has
/// the array's id, for which `squeue -j` lists every task of the array.
const ENDS_AT: &str = "SLURM_TIME_FORMAT=%s squeue -h -j \"$SLURM_JOB_ID\" -o '%A %e' | awk -v id=\"$SLURM_JOB_ID\" '$1 == id { print $2; exit }'";

/// How long before a placeholder's time limit Slurm signals it (USR1): the
/// launcher gives its tasks back before the limit kills it. A site that
/// preempts it sends the same signal (`preempt_send_user_signal`).
const SIGNAL_MARGIN: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct SlurmConfig {
    pub cluster: ClusterName,
    /// The partition placeholders go to.
    pub partition: String,
    pub qos: Option<String>,
    pub account: Option<String>,
    /// Slurm's nice value for placeholders (`--nice`): above 0 yields to
    /// the cluster's own jobs.
    pub nice: Option<i32>,
    /// Slots of each launcher: CPUs of one node (`--cpus-per-task`).
    pub launcher_slots: u32,
    /// Nodes placeholders must not go to (`--exclude`).
    pub reserve_hosts: Vec<String>,
    /// Time limit of each placeholder (`--time`); launchers drain before it.
    pub walltime: Option<Duration>,
    /// The least time a placeholder may be started with (`--time-min`):
    /// backfill gives it any limit between the two that fits a hole.
    pub min_walltime: Option<Duration>,
    /// Where placeholders' stdout/stderr go; discarded when unset.
    pub log_dir: Option<PathBuf>,
    /// The generic resource that counts GPUs (`--gres=<name>:N`); Slurm
    /// assigns the devices.
    pub gpu_resource: String,
    /// How long a batch-system command may take before it counts as failed.
    pub command_timeout: Duration,
    pub launcher: LauncherCommand,
}

pub struct SlurmBackend {
    config: SlurmConfig,
    hosts: Option<HostsReading>,
}

/// `sinfo` as last read, and where jobs ran then.
struct HostsReading {
    sinfo: String,
    at: Instant,
    allocations: BTreeSet<(String, String)>,
}

/// How old a reading of the nodes may be when no job has started or ended
/// since: a node drained or back in service is seen within it.
const HOSTS_MAX_AGE: Duration = Duration::from_secs(30);

impl HostsReading {
    /// Whether the nodes are as read, `now`, where jobs run as `allocations`
    /// says: their free CPUs, memory and GPUs change only when jobs start,
    /// end or move, their states within [`HOSTS_MAX_AGE`].
    fn still_true(&self, allocations: &BTreeSet<(String, String)>, now: Instant) -> bool {
        self.allocations == *allocations && now.saturating_duration_since(self.at) < HOSTS_MAX_AGE
    }
}

impl SlurmBackend {
    pub fn new(config: SlurmConfig) -> Self {
        Self {
            config,
            hosts: None,
        }
    }

    /// The nodes as `sinfo` shows them: read again only when where jobs
    /// run differs from the last reading's `allocations`, or it is old.
    async fn sinfo(
        &mut self,
        allocations: BTreeSet<(String, String)>,
        args: &[String],
    ) -> Result<String, BackendError> {
        let at = Instant::now();
        if let Some(hosts) = &self.hosts
            && hosts.still_true(&allocations, at)
        {
            return Ok(hosts.sinfo.clone());
        }
        let sinfo = self.run("sinfo", args, None).await?;
        self.hosts = Some(HostsReading {
            sinfo: sinfo.clone(),
            at,
            allocations,
        });
        Ok(sinfo)
    }

    async fn run(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&str>,
    ) -> Result<String, BackendError> {
        run(program, args, stdin, &[], self.config.command_timeout).await
    }

    /// One placeholder array of `count` launchers of `each` slots.
    async fn submit_array(
        &self,
        job: &JobId,
        count: u32,
        each: u32,
        task: TaskShape,
        run_as: Option<RunAs<'_>>,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let args = placeholder_args(
            c,
            job,
            count,
            each,
            placeholder_needs(task, each),
            &std::env::temp_dir(),
        );
        let launcher = c.launcher.for_run_as(run_as);
        let script = exported_none(&launcher.script(
            &c.cluster,
            job,
            each,
            task,
            PlaceholderTime {
                walltime: c.walltime,
                ends_at: c.min_walltime.map(|least| GivenEnd {
                    command: ENDS_AT,
                    least,
                }),
            },
            &format!("\"{SLURM_TASK_ID}\""),
        ));
        let (program, args) = as_account("sbatch", &args, run_as.map(|r| r.account));
        let answer = self.run(&program, &args, Some(&script)).await?;
        parse_job_id(&answer)
            .map(|_| ())
            .ok_or_else(|| BackendError {
                command: format!("sbatch {}", args.join(" ")),
                message: format!("unexpected answer {:?}", answer.trim()),
            })
    }
}

/// What every submission says: its name, partition and the site's QOS,
/// account and nice value, the script on stdin, no requeue, and none of
/// the submitting environment: by default sbatch hands the job all of
/// its own, which is the kcm's (root's, but for what `runuser` changes).
/// Time limits differ: a placeholder's walltime, a component's own.
fn sbatch_args(c: &SlurmConfig, name: String, workdir: &Path) -> Vec<String> {
    let mut args = vec![
        "--parsable".to_owned(),
        "--export=NONE".to_owned(),
        format!("--job-name={name}"),
        format!("--partition={}", c.partition),
        "--no-requeue".to_owned(),
        format!("--chdir={}", workdir.display()),
    ];
    if let Some(qos) = &c.qos {
        args.push(format!("--qos={qos}"));
    }
    if let Some(account) = &c.account {
        args.push(format!("--account={account}"));
    }
    if let Some(nice) = c.nice {
        args.push(format!("--nice={nice}"));
    }
    args
}

/// sbatch's options for one placeholder array of `count` launchers of
/// `each` CPUs on one node: warned before the time limit (and at
/// preemption), kept off reserved hosts, output to the log directory or
/// nowhere.
fn placeholder_args(
    c: &SlurmConfig,
    job: &JobId,
    count: u32,
    each: u32,
    needs: Needs,
    workdir: &Path,
) -> Vec<String> {
    let mut args = sbatch_args(c, placeholder_name(job.as_str()), workdir);
    args.extend([
        format!("--array=1-{count}"),
        "--nodes=1".to_owned(),
        "--ntasks=1".to_owned(),
        format!("--cpus-per-task={each}"),
    ]);
    if needs.memory_mb > 0 {
        args.push(format!("--mem={}M", needs.memory_mb));
    }
    if needs.gpus > 0 {
        args.push(format!("--gres={}:{}", c.gpu_resource, needs.gpus));
    }
    if let Some(walltime) = c.walltime {
        args.push(format!("--time={}", slurm_time(walltime)));
    }
    if let Some(least) = c.min_walltime {
        args.push(format!("--time-min={}", slurm_time(least)));
    }
    // Before the time limit, and at preemption where the site has
    // `preempt_send_user_signal`.
    args.push(format!("--signal=B:USR1@{}", SIGNAL_MARGIN.as_secs()));
    if !c.reserve_hosts.is_empty() {
        args.push(format!("--exclude={}", c.reserve_hosts.join(",")));
    }
    match &c.log_dir {
        Some(dir) => args.push(format!("--output={}/%x.%A_%a.log", dir.display())),
        None => args.extend([
            "--output=/dev/null".to_owned(),
            "--error=/dev/null".to_owned(),
        ]),
    }
    args
}

/// sbatch's options for a grid job's component: its slots as tasks, on
/// one node when it fits on one, its own time limit. Nothing of the
/// component's command, environment or directory: those are in its
/// script.
fn component_args(
    c: &SlurmConfig,
    spec: &ComponentSpec,
    one_host: bool,
    workdir: &Path,
) -> Vec<String> {
    let mut args = sbatch_args(c, component_name(&spec.job, spec.component), workdir);
    args.extend([
        format!("--ntasks={}", spec.slots.max(1)),
        "--output=/dev/null".to_owned(),
        "--error=/dev/null".to_owned(),
    ]);
    if one_host {
        args.push("--nodes=1".to_owned());
    }
    // Memory per CPU, as the component's slots may be spread over nodes.
    if spec.needs.memory_mb > 0 {
        let per_slot = spec.needs.memory_per_slot_mb(spec.slots);
        args.push(format!("--mem-per-cpu={per_slot}M"));
    }
    // GPUs per node on one node; spread, the job's total (cons_tres).
    match (spec.needs.gpus, one_host) {
        (0, _) => {}
        (gpus, true) => args.push(format!("--gres={}:{gpus}", c.gpu_resource)),
        (gpus, false) => args.push(format!("--gpus={gpus}")),
    }
    if let Some(walltime) = spec.walltime_ms {
        let limit = Duration::from_millis(walltime);
        args.push(format!("--time={}", slurm_time(limit)));
    }
    args
}

/// `script` as a job submitted with `--export=NONE` must run it: Slurm
/// hands it `SLURM_EXPORT_ENV=NONE`, which the steps it starts (a
/// component's `srun`) would inherit and so run without its variables,
/// and a `PATH` exported even where the owner's login environment, which
/// Slurm loads in place of the submitter's, has none (the launcher looks
/// tasks' programs up in it). Lines after the first, where Slurm reads no
/// options.
fn exported_none(script: &str) -> String {
    let (first, rest) = script.split_once('\n').unwrap_or((script, ""));
    format!(
        "{first}\nexport SLURM_EXPORT_ENV=ALL\nexport PATH=\"${{PATH:-/usr/local/bin:/usr/bin:/bin}}\"\n{rest}"
    )
}

/// A word nobody can guess, new each time, that starts each job's line of
/// `squeue` output ([`squeue_format`]): the keys of std's hasher are
/// random for each process, and each hasher's differ.
fn marker() -> String {
    use std::hash::{BuildHasher, Hasher};
    let word = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("gleaner{word:016x}")
}

/// `--parsable` answers `1234` or `1234;cluster`.
fn parse_job_id(answer: &str) -> Option<u64> {
    answer.trim().split(';').next()?.parse().ok()
}

/// A time limit as Slurm reads it, `minutes:seconds`, rounded up to a
/// whole second.
fn slurm_time(limit: Duration) -> String {
    let seconds = limit.as_secs() + u64::from(limit.subsec_nanos() > 0);
    let seconds = seconds.max(1);
    format!("{}:{:02}", seconds / 60, seconds % 60)
}

impl Backend for SlurmBackend {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    fn launcher_command(&self) -> &LauncherCommand {
        &self.config.launcher
    }

    async fn snapshot(&mut self) -> Result<Snapshot, BackendError> {
        let sinfo_args: Vec<String> = ["-h", "-N", "-O", SINFO_FIELDS].map(str::to_owned).to_vec();
        let squeue_args: Vec<String> = ["-h", "-r", "-a"].map(str::to_owned).to_vec();
        // The format in squeue's environment, which only root can read.
        let marker = marker();
        let format = squeue_format(&marker);
        // Start times as seconds since the epoch, whatever the time zone.
        let env = [
            ("SQUEUE_FORMAT", format.as_str()),
            ("SLURM_TIME_FORMAT", "%s"),
        ];
        let timeout = self.config.command_timeout;
        let queue = run("squeue", &squeue_args, None, &env, timeout).await?;
        let unexpected = |message| BackendError {
            command: format!("squeue {}", squeue_args.join(" ")),
            message,
        };
        let allocations = squeue::allocations(&queue, &marker).map_err(unexpected)?;
        let sinfo = self.sinfo(allocations, &sinfo_args).await?;
        let partition = &self.config.partition;
        let gpus = &self.config.gpu_resource;
        squeue::snapshot(&sinfo, &queue, &marker, partition, gpus).map_err(|message| BackendError {
            command: format!(
                "sinfo {} / squeue {}",
                sinfo_args.join(" "),
                squeue_args.join(" ")
            ),
            message,
        })
    }

    async fn submit(
        &mut self,
        job: &JobId,
        slots: u32,
        task: TaskShape,
        run_as: Option<RunAs<'_>>,
    ) -> Result<u32, BackendError> {
        let this = &*self;
        let size = this.config.launcher_slots;
        submit_arrays(job, slots, size, task.slots, |count, each| {
            this.submit_array(job, count, each, task, run_as)
        })
        .await
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        let this = &*self;
        remove_all(ids, "Invalid job id", |chunk| async move {
            this.run("scancel", &chunk, None).await
        })
        .await
    }

    fn components_as_owner(&self) -> bool {
        true
    }

    async fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
        one_host: bool,
        run_as: Option<&Account>,
    ) -> Result<(), BackendError> {
        let args = component_args(&self.config, spec, one_host, &std::env::temp_dir());
        // Submitted as the owner, it runs as them: the script has no
        // account to switch to.
        let script = exported_none(&files.script(spec, None, ComponentHosts::Slurm));
        let (program, args) = as_account("sbatch", &args, run_as);
        let answer = self.run(&program, &args, Some(&script)).await?;
        parse_job_id(&answer)
            .map(|_| ())
            .ok_or_else(|| BackendError {
                command: format!("{program} {}", args.join(" ")),
                message: format!("unexpected answer {:?}", answer.trim()),
            })
    }

    async fn shutdown(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reading_has_a_marker_of_its_own() {
        let (first, second) = (marker(), marker());
        assert_ne!(first, second);
        assert!(squeue_format(&first).starts_with(&format!("{first}|%i|")));
    }

    #[test]
    fn answers_and_time_limits() {
        assert_eq!(parse_job_id("1234\n"), Some(1234));
        assert_eq!(parse_job_id("1234;gleaner\n"), Some(1234));
        assert_eq!(parse_job_id("sbatch: error"), None);
        assert_eq!(slurm_time(Duration::from_secs(3600)), "60:00");
        assert_eq!(slurm_time(Duration::from_millis(1500)), "0:02");
        assert_eq!(slurm_time(Duration::ZERO), "0:01");
    }

    fn config() -> SlurmConfig {
        SlurmConfig {
            cluster: "c1".into(),
            partition: "debug".into(),
            qos: None,
            account: Some("physics".into()),
            nice: Some(100),
            launcher_slots: 1,
            reserve_hosts: vec!["n1".into(), "n2".into()],
            walltime: Some(Duration::from_secs(3600)),
            min_walltime: Some(Duration::from_secs(600)),
            gpu_resource: "gpu".into(),
            log_dir: None,
            command_timeout: Duration::from_secs(10),
            launcher: LauncherCommand {
                gpu_devices: Vec::new(),
                program: "/opt/gleaner".into(),
                args: Vec::new(),
                env: Vec::new(),
                broker_urls: Vec::new(),
                launcher_settings: String::new(),
            },
        }
    }

    #[test]
    fn the_nodes_are_read_again_when_jobs_moved_or_the_reading_is_old() {
        let at = Instant::now();
        let running = |jobs: &[(&str, &str)]| -> BTreeSet<(String, String)> {
            jobs.iter()
                .map(|(id, nodes)| (id.to_string(), nodes.to_string()))
                .collect()
        };
        let hosts = HostsReading {
            sinfo: String::new(),
            at,
            allocations: running(&[("7_1", "node1")]),
        };
        let soon = at + Duration::from_secs(5);
        assert!(hosts.still_true(&running(&[("7_1", "node1")]), soon));
        assert!(
            !hosts.still_true(&running(&[("7_1", "node2")]), soon),
            "moved"
        );
        assert!(!hosts.still_true(&running(&[]), soon), "ended");
        assert!(
            !hosts.still_true(&running(&[("7_1", "node1"), ("8", "node2")]), soon),
            "started"
        );
        assert!(
            !hosts.still_true(&running(&[("7_1", "node1")]), at + HOSTS_MAX_AGE),
            "old"
        );
    }

    #[test]
    fn a_placeholder_array_asks_exactly_for_what_the_site_set() {
        let job: JobId = "sweep-0123456789abcdef".parse().unwrap();
        let args = placeholder_args(&config(), &job, 3, 4, Needs::default(), Path::new("/tmp"));
        assert_eq!(
            args,
            [
                "--parsable",
                "--export=NONE",
                "--job-name=gl-sweep-0123456789abcdef",
                "--partition=debug",
                "--no-requeue",
                "--chdir=/tmp",
                "--account=physics",
                "--nice=100",
                "--array=1-3",
                "--nodes=1",
                "--ntasks=1",
                "--cpus-per-task=4",
                "--time=60:00",
                "--time-min=10:00",
                "--signal=B:USR1@60",
                "--exclude=n1,n2",
                "--output=/dev/null",
                "--error=/dev/null",
            ]
        );
        let needs = Needs {
            memory_mb: 6000,
            gpus: 2,
        };
        let args = placeholder_args(&config(), &job, 1, 4, needs, Path::new("/tmp")).join(" ");
        assert!(
            args.contains("--cpus-per-task=4 --mem=6000M --gres=gpu:2 "),
            "{args}"
        );
        let mut logged = config();
        logged.log_dir = Some("/var/log/gleaner".into());
        let args = placeholder_args(&logged, &job, 1, 1, Needs::default(), Path::new("/tmp"));
        assert_eq!(
            args.last().map(String::as_str),
            Some("--output=/var/log/gleaner/%x.%A_%a.log")
        );
    }

    #[test]
    fn a_components_options_carry_nothing_of_its_owners_text() {
        let spec = ComponentSpec {
            needs: Default::default(),
            job: "grid-0123456789abcdef".parse().unwrap(),
            component: 1,
            slots: 6,
            command: "sleep 12\n#SBATCH --nice=-1000\ntrue".into(),
            env: vec![("SBATCH_QOS".into(), "high".into())],
            walltime_ms: Some(90_500),
            workdir: Some("/home/alice".into()),
            owner: "alice".into(),
            checkpoint: None,
            inputs: Vec::new(),
        };
        let args = component_args(&config(), &spec, true, Path::new("/tmp"));
        let joined = args.join(" ");
        assert!(
            joined.starts_with(
                "--parsable --export=NONE --job-name=gg-grid-0123456789abcdef.1 --partition=debug"
            ),
            "{joined}"
        );
        assert!(
            joined
                .contains("--ntasks=6 --output=/dev/null --error=/dev/null --nodes=1 --time=1:31"),
            "{joined}"
        );
        assert!(
            !joined.contains("-1000") && !joined.contains("high"),
            "{joined}"
        );
        let spread = component_args(&config(), &spec, false, Path::new("/tmp"));
        assert!(!spread.iter().any(|a| a == "--nodes=1"), "{spread:?}");
        let needing = ComponentSpec {
            needs: Needs {
                memory_mb: 6000,
                gpus: 2,
            },
            ..spec
        };
        let joined = component_args(&config(), &needing, true, Path::new("/tmp")).join(" ");
        assert!(
            joined.contains("--mem-per-cpu=1000M --gres=gpu:2"),
            "{joined}"
        );
        let spread = component_args(&config(), &needing, false, Path::new("/tmp")).join(" ");
        assert!(spread.contains("--mem-per-cpu=1000M --gpus=2"), "{spread}");
    }

    /// Alice's component 0 of `job`: `srun ./app` on `slots` slots.
    fn srun_app(job: &JobId, slots: u32) -> ComponentSpec {
        ComponentSpec {
            job: job.clone(),
            slots,
            ..crate::backend::tests::component("srun ./app")
        }
    }

    #[test]
    fn no_submission_hands_its_job_the_kcms_environment() {
        let job: JobId = "sweep-0123456789abcdef".parse().unwrap();
        let spec = srun_app(&job, 2);
        let alice = Account {
            name: "alice".into(),
            uid: nix::unistd::Uid::from_raw(4242),
            gid: nix::unistd::Gid::from_raw(4242),
            groups: Vec::new(),
            home: "/home/alice".into(),
        };
        let tmp = Path::new("/tmp");
        for args in [
            placeholder_args(&config(), &job, 2, 1, Needs::default(), tmp),
            component_args(&config(), &spec, true, tmp),
        ] {
            for run_as in [None, Some(&alice)] {
                let (_, ran) = as_account("sbatch", &args, run_as);
                let exports: Vec<&String> =
                    ran.iter().filter(|a| a.starts_with("--export")).collect();
                assert_eq!(exports, ["--export=NONE"], "{ran:?}");
            }
        }
    }

    #[test]
    fn a_script_run_without_the_kcms_environment_gives_its_steps_their_own() {
        let files = ComponentFiles::new(
            Path::new("/spool"),
            &"j-0000000000000001".parse().unwrap(),
            0,
        );
        let spec = srun_app(&"j-0000000000000001".parse().unwrap(), 1);
        let script = exported_none(&files.script(&spec, None, ComponentHosts::Slurm));
        assert!(
            script.starts_with("#!/bin/sh\nexport SLURM_EXPORT_ENV=ALL\n"),
            "{script}"
        );
        let (head, _) = script.split_once("umask").expect("the script's own lines");
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("{head}env")])
            .env_clear()
            .env("SLURM_EXPORT_ENV", "NONE")
            .output()
            .expect("sh");
        let env = String::from_utf8_lossy(&out.stdout);
        assert!(env.contains("SLURM_EXPORT_ENV=ALL\n"), "{env}");
        assert!(env.lines().any(|l| l.starts_with("PATH=/")), "{env}");
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("{head}echo \"$PATH\"")])
            .env_clear()
            .env("PATH", "/opt/alice/bin:/usr/bin")
            .output()
            .expect("sh");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/opt/alice/bin:/usr/bin\n",
            "the owner's own kept"
        );
    }

    #[test]
    fn the_job_script_names_the_launcher_after_its_array_task() {
        let command = LauncherCommand {
            gpu_devices: Vec::new(),
            program: "/opt/gleaner".into(),
            args: vec!["launcher".into()],
            env: vec![("GLEANER_BROKER_URL".into(), "amqp://h/v".into())],
            broker_urls: vec!["amqp://h/v".into()],
            launcher_settings: String::new(),
        };
        let job: JobId = "sweep-00000000000beef0".parse().unwrap();
        let script = command.script(
            &"c1".into(),
            &job,
            4,
            TaskShape::slots(1),
            PlaceholderTime {
                walltime: Some(Duration::from_secs(600)),
                ends_at: Some(GivenEnd {
                    command: ENDS_AT,
                    least: Duration::from_secs(300),
                }),
            },
            &format!("\"{SLURM_TASK_ID}\""),
        );
        assert!(script.contains("export GLEANER_BROKER_URL='amqp://h/v'"));
        assert!(
            script.contains(&format!(
                "gleaner_ends_at=$({{ {ENDS_AT}; }} 2>/dev/null | tr -dc 0-9)\n"
            )) && script.contains("--walltime 600s --ends-at \"$gleaner_ends_at\""),
            "{script}"
        );
        assert!(
            script.contains(
                "[ -n \"$gleaner_ends_at\" ] || gleaner_ends_at=$(( $(date +%s) + 300 ))\n"
            ),
            "an end that cannot be read is the least Slurm may give: {script}"
        );
        assert!(script.contains(
            "--id 'c1'-\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\" --slot \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\" --slots 4"
        ), "{script}");
    }

    /// The end read is the placeholder's own, whichever task of its array
    /// it is: the last task's id is the array's, which `squeue -j` answers
    /// with every task of the array.
    #[test]
    fn a_placeholder_reads_its_own_end_and_not_its_arrays() {
        let dir = tempfile::tempdir().unwrap();
        let squeue = dir.path().join("squeue");
        std::fs::write(
            &squeue,
            "#!/bin/sh\nprintf '412 1795953285\\n413 1795953286\\n414 1795953287\\n'\n",
        )
        .unwrap();
        std::fs::set_permissions(&squeue, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        for (id, end) in [("412", "1795953285"), ("414", "1795953287")] {
            let out = std::process::Command::new("sh")
                .args(["-c", ENDS_AT])
                .env("PATH", &path)
                .env("SLURM_JOB_ID", id)
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), end, "job {id}");
        }
    }
}
