//! Sun/Son of Grid Engine: launchers as placeholder array jobs.
//!
//! `qsub` submits `m` launchers as one array job named `gl-<job>`, at the
//! lowest priority, with `-notify` (so a `qdel` warns the launcher with
//! SIGUSR2 before it kills it) and the configured `h_rt`. `qstat -xml` is
//! read on every poll; placeholders and components are recognised by
//! their name and their owner (the kcm's core judges: `core::KcmCore`),
//! so a restarted kcm adopts what its predecessor left running, and
//! nobody else's job named like them.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use gleaner_manifest::{JobId, Needs, TaskShape};
use tracing::warn;

use crate::{
    backend::RunAs,
    backend::{
        Backend, BackendError, ComponentFiles, ComponentHosts, LauncherCommand, PlaceholderTime,
        as_account, placeholder_needs, remove_all, run, submit_arrays,
    },
    contain::Account,
    qstat::{self, AllocationRule, Consumables, allocation_rule},
    snapshot::Snapshot,
};
use gleaner_protocol::{
    ClusterName, ComponentSpec,
    naming::{SGE_TASK_ID, component_name, placeholder_name, same_host},
};

#[derive(Debug, Clone)]
pub struct SgeConfig {
    pub cluster: ClusterName,
    /// The cluster queue placeholders go to (`-q`).
    pub queue: String,
    /// Slots of each launcher; more than 1 asks for them on one host
    /// through `pe_one_host`.
    pub launcher_slots: u32,
    /// Parallel environment keeping a job's slots on one host (`$pe_slots`).
    pub pe_one_host: String,
    /// Parallel environment spreading a job over hosts (`$round_robin`).
    pub pe_spread: String,
    /// Hosts placeholders must not go to.
    pub reserve_hosts: Vec<String>,
    /// Walltime of each placeholder (`-l h_rt`); launchers drain before it.
    pub h_rt: Option<Duration>,
    /// Where placeholders' stdout/stderr go; discarded when unset.
    pub log_dir: Option<PathBuf>,
    /// The consumable complex that counts memory, per slot (`mem_free`,
    /// `h_vmem`, a site's own).
    pub memory_resource: String,
    /// The consumable complex that counts GPUs, per job (`consumable JOB`).
    pub gpu_resource: String,
    /// How long a batch-system command may take before it counts as failed.
    pub command_timeout: Duration,
    pub launcher: LauncherCommand,
}

pub struct SgeBackend {
    config: SgeConfig,
    /// Allocation rules of the parallel environments waiting jobs asked
    /// for, read once each with `qconf -sp`.
    pe_rules: BTreeMap<String, AllocationRule>,
    /// The queue's hosts, as last read.
    hosts: Vec<String>,
}

impl SgeBackend {
    pub fn new(config: SgeConfig) -> Self {
        Self {
            config,
            pe_rules: BTreeMap::new(),
            hosts: Vec::new(),
        }
    }

    /// Learns the allocation rules of parallel environments not seen yet.
    /// One that cannot be read counts as spread (and is not asked again).
    async fn learn_pe_rules(&mut self, names: Vec<String>) {
        for name in names {
            let rule = match self
                .run("qconf", &["-sp".to_owned(), name.clone()], None)
                .await
            {
                Ok(text) => allocation_rule(&text),
                Err(e) => {
                    warn!(pe = name, error = %e, "cannot read a parallel environment; its jobs count as spread over hosts");
                    None
                }
            };
            self.pe_rules
                .insert(name, rule.unwrap_or(AllocationRule::Spread));
        }
    }

    /// The complexes that count memory and GPUs here.
    fn consumables(&self) -> Consumables {
        Consumables {
            memory: self.config.memory_resource.clone(),
            gpu: self.config.gpu_resource.clone(),
        }
    }

    /// Runs a Grid Engine command, with its cell's environment.
    async fn run(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&str>,
    ) -> Result<String, BackendError> {
        let mut env: Vec<(&str, &str)> =
            [("SGE_ROOT", "/var/lib/gridengine"), ("SGE_CELL", "default")]
                .into_iter()
                .filter(|(key, _)| std::env::var_os(key).is_none())
                .collect();
        // Times as UTC, which the snapshot reads them as.
        env.push(("TZ", "UTC"));
        run(program, args, stdin, &env, self.config.command_timeout).await
    }

    /// Where placeholders may go: the queue, or its instances on the hosts
    /// that are not reserved.
    fn placeholder_queue(&self) -> Result<String, BackendError> {
        let c = &self.config;
        if c.reserve_hosts.is_empty() {
            return Ok(c.queue.clone());
        }
        let instances: Vec<String> = self
            .hosts
            .iter()
            .filter(|h| !c.reserve_hosts.iter().any(|r| same_host(r, h)))
            .map(|h| format!("{}@{h}", c.queue))
            .collect();
        if instances.is_empty() {
            return Err(BackendError {
                command: "qsub".to_owned(),
                message: format!(
                    "no host of {} is free of reserve_hosts (or none read yet)",
                    c.queue
                ),
            });
        }
        Ok(instances.join(","))
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
        let queue = self.placeholder_queue()?;
        let needs = placeholder_needs(task, each);
        let args = placeholder_args(c, job, queue, count, each, needs, &std::env::temp_dir());
        let launcher = c.launcher.for_run_as(run_as);
        let script = launcher.script(
            &c.cluster,
            job,
            each,
            task,
            PlaceholderTime {
                walltime: c.h_rt,
                ends_at: None,
            },
            &format!("\"{SGE_TASK_ID}\""),
        );
        let (program, args) = as_account("qsub", &args, run_as.map(|r| r.account));
        let answer = self.run(&program, &args, Some(&script)).await?;
        // `-terse` answers `4711.1-8:1` for an array job.
        let number = answer.trim().split('.').next().unwrap_or("");
        if number.parse::<u64>().is_err() {
            return Err(BackendError {
                command: format!("qsub {}", args.join(" ")),
                message: format!("unexpected answer {:?}", answer.trim()),
            });
        }
        Ok(())
    }
}

/// What every submission says: its name and queue, the script on stdin
/// run by `/bin/sh`, and `-w e`, which refuses a job that could never
/// run rather than leave it waiting. `-clear` first: what the default
/// request files (the cell's, the submitting owner's `~/.sge_request`,
/// the working directory's) and any `#$` line of the script asked is
/// dropped, so the job is exactly what these options say.
fn qsub_args(name: String, queue: String, workdir: &Path) -> Vec<String> {
    vec![
        "-clear".into(),
        "-terse".into(),
        "-N".into(),
        name,
        "-q".into(),
        queue,
        "-w".into(),
        "e".into(),
        "-S".into(),
        "/bin/sh".into(),
        "-wd".into(),
        workdir.display().to_string(),
    ]
}

/// qsub's options for one placeholder array of `count` launchers of
/// `each` slots on `queue`: the lowest priority, warned before a kill,
/// the site's walltime, output to the log directory or nowhere.
fn placeholder_args(
    c: &SgeConfig,
    job: &JobId,
    queue: String,
    count: u32,
    each: u32,
    needs: Needs,
    workdir: &Path,
) -> Vec<String> {
    let mut args = qsub_args(placeholder_name(job.as_str()), queue, workdir);
    args.extend(resource_requests(c, each, needs));
    args.extend([
        "-t".into(),
        format!("1-{count}"),
        "-p".into(),
        "-1023".into(),
        "-notify".into(),
    ]);
    if each > 1 {
        args.extend(["-pe".into(), c.pe_one_host.clone(), each.to_string()]);
    }
    if let Some(h_rt) = c.h_rt {
        args.extend(["-l".into(), format!("h_rt={}", h_rt.as_secs().max(1))]);
    }
    match &c.log_dir {
        Some(dir) => {
            let dir = dir.display();
            args.extend([
                "-j".into(),
                "y".into(),
                "-o".into(),
                format!("{dir}/$JOB_NAME.$JOB_ID.$TASK_ID.log"),
            ]);
        }
        None => args.extend([
            "-o".into(),
            "/dev/null".into(),
            "-e".into(),
            "/dev/null".into(),
        ]),
    }
    args
}

/// qsub's options for a grid job's component: its slots in one host's
/// parallel environment or spread, its walltime in whole seconds
/// (rounded up). Nothing of the component's command, environment or
/// directory: those are in its script, which `-clear` keeps from
/// speaking to Grid Engine.
fn component_args(
    c: &SgeConfig,
    spec: &ComponentSpec,
    one_host: bool,
    workdir: &Path,
) -> Vec<String> {
    let name = component_name(&spec.job, spec.component);
    let mut args = qsub_args(name, c.queue.clone(), workdir);
    args.extend([
        "-o".into(),
        "/dev/null".into(),
        "-e".into(),
        "/dev/null".into(),
    ]);
    if spec.slots > 1 {
        let pe = match one_host {
            true => &c.pe_one_host,
            false => &c.pe_spread,
        };
        args.extend(["-pe".into(), pe.clone(), spec.slots.to_string()]);
    }
    if let Some(walltime) = spec.walltime_ms {
        args.extend([
            "-l".into(),
            format!("h_rt={}", walltime.div_ceil(1000).max(1)),
        ]);
    }
    args.extend(resource_requests(c, spec.slots, spec.needs));
    args
}

/// `-l` requests for a job of `slots` slots needing `needs` in all:
/// memory per slot (Grid Engine multiplies it by the slots), GPUs per job.
fn resource_requests(c: &SgeConfig, slots: u32, needs: Needs) -> Vec<String> {
    let mut requests = Vec::new();
    if needs.memory_mb > 0 {
        let per_slot = needs.memory_per_slot_mb(slots);
        requests.push(format!("{}={per_slot}M", c.memory_resource));
    }
    if needs.gpus > 0 {
        requests.push(format!("{}={}", c.gpu_resource, needs.gpus));
    }
    match requests.is_empty() {
        true => Vec::new(),
        false => vec!["-l".to_owned(), requests.join(",")],
    }
}

impl Backend for SgeBackend {
    fn kind(&self) -> &'static str {
        "sge"
    }

    fn launcher_command(&self) -> &LauncherCommand {
        &self.config.launcher
    }

    async fn snapshot(&mut self) -> Result<Snapshot, BackendError> {
        let resources = self.consumables().names();
        let args: Vec<String> = [
            "-f",
            "-r",
            "-xml",
            "-q",
            &self.config.queue,
            "-u",
            "*",
            "-F",
            &resources,
        ]
        .map(str::to_owned)
        .to_vec();
        let xml = self.run("qstat", &args, None).await.map_err(|mut e| {
            // qstat exits 1 without a word for a queue that does not exist.
            if e.message.trim_end().ends_with(':') {
                e.message = format!(
                    "{} (no output: is {} a queue of this cell? `qconf -sql` lists them)",
                    e.message.trim_end(),
                    self.config.queue
                );
            }
            e
        })?;
        let failed = |message| BackendError {
            command: format!("qstat {}", args.join(" ")),
            message,
        };
        let read = qstat::read(&xml).map_err(failed)?;
        let unknown: Vec<String> = read
            .requested_pes()
            .into_iter()
            .filter(|pe| !self.pe_rules.contains_key(*pe))
            .map(str::to_owned)
            .collect();
        self.learn_pe_rules(unknown).await;
        let snapshot = read
            .snapshot(&self.config.queue, &self.pe_rules, &self.consumables())
            .map_err(failed)?;
        self.hosts = snapshot.hosts.iter().map(|h| h.name.clone()).collect();
        Ok(snapshot)
    }

    async fn submit(
        &mut self,
        job: &JobId,
        slots: u32,
        task: TaskShape,
        run_as: Option<RunAs<'_>>,
    ) -> Result<u32, BackendError> {
        if task.needs.gpus > 0 && self.config.launcher.gpu_devices.is_empty() {
            // Grid Engine counts GPUs but does not say which are whose.
            return Err(BackendError {
                command: "qsub".to_owned(),
                message: "the job's tasks need GPUs, and this cluster lists none (`gpus`): its launchers could not tell which devices are theirs".to_owned(),
            });
        }
        let this = &*self;
        let size = this.config.launcher_slots;
        submit_arrays(job, slots, size, task.slots, |count, each| {
            this.submit_array(job, count, each, task, run_as)
        })
        .await
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        let this = &*self;
        remove_all(ids, "does not exist", |chunk| async move {
            this.run("qdel", &chunk, None).await
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
        let script = files.script(spec, None, ComponentHosts::GridEngine);
        let (program, args) = as_account("qsub", &args, run_as);
        self.run(&program, &args, Some(&script)).await?;
        Ok(())
    }

    /// Placeholders outlive the kcm: the next one adopts them.
    async fn shutdown(&mut self) {}
}

#[cfg(test)]
mod tests {
    use gleaner_protocol::naming::LAUNCHER_SUBCOMMAND;

    use super::*;

    fn backend() -> SgeBackend {
        SgeBackend::new(SgeConfig {
            cluster: "c1".into(),
            queue: "c1.q".into(),
            launcher_slots: 1,
            pe_one_host: "smp".into(),
            pe_spread: "make".into(),
            reserve_hosts: Vec::new(),
            h_rt: Some(Duration::from_secs(3600)),
            memory_resource: "mem_free".into(),
            gpu_resource: "gpu".into(),
            log_dir: None,
            command_timeout: Duration::from_secs(10),
            launcher: LauncherCommand {
                gpu_devices: Vec::new(),
                program: "/opt/gleaner's bin/gleaner".into(),
                args: vec![LAUNCHER_SUBCOMMAND.into()],
                env: vec![(
                    "GLEANER_BROKER_URL".into(),
                    "amqp://u:p@h/v?heartbeat=10".into(),
                )],
                broker_urls: vec!["amqp://u:p@h/v?heartbeat=10".into()],
                launcher_settings: "[launcher]\nidle_timeout = \"5s\"\n".into(),
            },
        })
    }

    fn spec(slots: u32, walltime_ms: Option<u64>) -> ComponentSpec {
        ComponentSpec {
            needs: Default::default(),
            job: "grid-0123456789abcdef".parse().unwrap(),
            component: 2,
            slots,
            command: "sleep 12\n#$ -p 1000\ntrue".into(),
            env: vec![("X".into(), "#$ -i /etc/shadow".into())],
            walltime_ms,
            workdir: Some("/home/alice/#$ -l h=x".into()),
            owner: "alice".into(),

            checkpoint: None,

            inputs: Vec::new(),
        }
    }

    #[test]
    fn a_placeholder_array_asks_exactly_for_what_the_site_set() {
        let mut config = backend().config;
        let job: JobId = "sweep-0123456789abcdef".parse().unwrap();
        let args = placeholder_args(
            &config,
            &job,
            "c1.q".into(),
            3,
            1,
            Needs::default(),
            Path::new("/tmp"),
        );
        assert_eq!(args[0], "-clear", "default request files say nothing");
        assert!(
            !args.iter().any(|a| a == "-V" || a == "-v"),
            "none of the kcm's environment: {args:?}"
        );
        let joined = args.join(" ");
        assert!(
            joined.contains("-N gl-sweep-0123456789abcdef -q c1.q -w e"),
            "{joined}"
        );
        assert!(joined.contains("-t 1-3 -p -1023 -notify"), "{joined}");
        assert!(joined.contains("-l h_rt=3600"), "{joined}");
        assert!(
            !joined.contains("-pe"),
            "one slot each needs no environment: {joined}"
        );
        assert!(joined.ends_with("-o /dev/null -e /dev/null"), "{joined}");
        config.log_dir = Some("/var/log/gleaner".into());
        config.h_rt = None;
        let joined = placeholder_args(
            &config,
            &job,
            "c1.q@a".into(),
            2,
            4,
            Needs::default(),
            Path::new("/tmp"),
        )
        .join(" ");
        assert!(joined.contains("-pe smp 4"), "{joined}");
        assert!(!joined.contains("h_rt"), "{joined}");
        assert!(
            joined.ends_with("-j y -o /var/log/gleaner/$JOB_NAME.$JOB_ID.$TASK_ID.log"),
            "{joined}"
        );
    }

    #[test]
    fn placeholders_and_components_ask_for_memory_by_slot_and_gpus_by_job() {
        let config = backend().config;
        let job: JobId = "sweep-0123456789abcdef".parse().unwrap();
        // A launcher of 4 slots running two tasks of 2 slots, 3000M and a GPU each.
        let needs = Needs {
            memory_mb: 6000,
            gpus: 2,
        };
        let joined = placeholder_args(&config, &job, "c1.q".into(), 1, 4, needs, Path::new("/tmp"))
            .join(" ");
        assert!(joined.contains("-l mem_free=1500M,gpu=2"), "{joined}");
        let memory_only = Needs {
            memory_mb: 1000,
            gpus: 0,
        };
        let joined = placeholder_args(
            &config,
            &job,
            "c1.q".into(),
            1,
            3,
            memory_only,
            Path::new("/tmp"),
        )
        .join(" ");
        assert!(joined.contains("-l mem_free=334M "), "rounded up: {joined}");
        let mut component = spec(4, None);
        component.needs.gpus = 1;
        let joined = component_args(&config, &component, true, Path::new("/tmp")).join(" ");
        assert!(joined.ends_with("-l gpu=1"), "{joined}");
    }

    #[test]
    fn a_components_options_carry_nothing_of_its_owners_text() {
        let config = backend().config;
        let one_host = component_args(&config, &spec(4, Some(1500)), true, Path::new("/tmp"));
        let joined = one_host.join(" ");
        assert_eq!(one_host[0], "-clear");
        assert!(
            !one_host.iter().any(|a| a == "-V" || a == "-v"),
            "none of the kcm's environment: {one_host:?}"
        );
        assert!(
            joined.contains("-N gg-grid-0123456789abcdef.2 -q c1.q"),
            "{joined}"
        );
        assert!(joined.contains("-pe smp 4"), "{joined}");
        assert!(
            joined.contains("-l h_rt=2"),
            "walltime rounded up: {joined}"
        );
        assert!(
            !joined.contains("#$") && !joined.contains("shadow"),
            "{joined}"
        );
        let spread = component_args(&config, &spec(4, None), false, Path::new("/tmp")).join(" ");
        assert!(
            spread.contains("-pe make 4") && !spread.contains("h_rt"),
            "{spread}"
        );
        let single = component_args(&config, &spec(1, None), false, Path::new("/tmp")).join(" ");
        assert!(!single.contains("-pe"), "{single}");
    }

    #[test]
    fn a_gpu_launcher_is_told_its_tasks_needs_and_the_hosts_gpus_quoted() {
        let mut command = backend().config.launcher;
        command.gpu_devices = vec!["0".into(), "GPU-1;x".into()];
        let job: JobId = "j-0000000000000001".parse().unwrap();
        let shape = TaskShape {
            slots: 1,
            needs: Needs {
                memory_mb: 2048,
                gpus: 1,
            },
        };
        let script = command.script(
            &"c1".into(),
            &job,
            2,
            shape,
            PlaceholderTime::default(),
            "\"$JOB_ID\"",
        );
        assert!(
            script.contains("--task-memory 2048M --task-gpus 1 --gpu-devices '0','GPU-1;x'"),
            "{script}"
        );
    }

    #[test]
    fn an_owners_launchers_get_their_jobs_account_and_nothing_of_the_kcms() {
        let sge = backend();
        let settings = std::path::Path::new("/spool/launchers/j-0000000000000001.toml");
        let job: JobId = "j-0000000000000001".parse().unwrap();
        let script = sge.config.launcher.for_owner(settings).script(
            &"c1".into(),
            &job,
            1,
            TaskShape::slots(1),
            PlaceholderTime::default(),
            "\"$JOB_ID.$SGE_TASK_ID\"",
        );
        assert!(!script.contains("u:p"), "{script}");
        assert!(
            script.contains("export GLEANER_CONFIG='/spool/launchers/j-0000000000000001.toml'"),
            "{script}"
        );
        let credentials = gleaner_protocol::Credentials {
            user: "gleaner-launcher-j-0000000000000001".into(),
            password: "pw".into(),
        };
        let text = sge.config.launcher.owner_settings(&credentials);
        assert!(
            text.contains(
                r#"broker_urls = ["amqp://gleaner-launcher-j-0000000000000001:pw@h/v?heartbeat=10"]"#
            ),
            "{text}"
        );
        assert!(text.contains("[launcher]\nidle_timeout"), "{text}");
        assert!(
            !format!("{credentials:?}").contains("pw"),
            "no password in logs"
        );
    }

    #[test]
    fn reserved_hosts_get_no_placeholders() {
        let mut sge = backend();
        assert_eq!(sge.placeholder_queue().unwrap(), "c1.q");
        sge.config.reserve_hosts = vec!["node3".into()];
        assert!(sge.placeholder_queue().is_err(), "no hosts read yet");
        sge.hosts = ["node1", "node2", "node3.grid.example"]
            .map(String::from)
            .to_vec();
        assert_eq!(sge.placeholder_queue().unwrap(), "c1.q@node1,c1.q@node2");
    }

    #[test]
    fn the_job_script_names_the_launcher_after_its_array_task() {
        let c = backend().config;
        let job = "sweep-3fa9c2d41e07b5a8".parse().unwrap();
        let script = c.launcher.script(
            &c.cluster,
            &job,
            1,
            TaskShape::slots(1),
            PlaceholderTime {
                walltime: c.h_rt,
                ends_at: None,
            },
            &format!("\"{SGE_TASK_ID}\""),
        );
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains("export GLEANER_BROKER_URL='amqp://u:p@h/v?heartbeat=10'\n"));
        assert!(script.contains(
            r"exec '/opt/gleaner'\''s bin/gleaner' 'launcher' --job 'sweep-3fa9c2d41e07b5a8'"
        ));
        assert!(
            script.contains(r#"--id 'c1'-"$JOB_ID.$SGE_TASK_ID" --slot "$JOB_ID.$SGE_TASK_ID""#)
        );
        assert!(script.trim_end().ends_with("--walltime 3600s"));
    }
}
