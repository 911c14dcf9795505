//! The embedded default: launchers are child processes of the kcm, within a
//! fixed number of slots. Lets `gleaner up` work with nothing but RabbitMQ.

use std::{os::fd::AsRawFd, process::Stdio, time::Duration};

use gleaner_manifest::{JobId, Needs, TaskShape};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::process::{Child, Command};
use tracing::{debug, warn};

use gleaner_protocol::{
    ClusterName, ComponentSpec,
    naming::{LauncherArgs, launcher_id, local_component_batch_id, local_launcher_batch_id},
};

use crate::{
    backend::{
        Backend, BackendError, ComponentFiles, ComponentHosts, LauncherCommand, RunAs, kcm_only,
    },
    claims::{Claim, GpuClaims},
    contain::{self, Account, Cgroups},
    snapshot::{ComponentRun, Host, Placeholder, Snapshot, Timing},
};

struct Launcher {
    id: String,
    job: JobId,
    /// The account it runs as.
    owner: String,
    /// The first of its slots, which names it in the consumer tag.
    slot: u32,
    slots: u32,
    /// Memory and GPUs its tasks need together.
    needs: Needs,
    child: Child,
}

/// A grid job's component: waiting for its slots, then a process group.
struct Component {
    id: String,
    spec: ComponentSpec,
    script: String,
    child: Option<Child>,
}

pub struct LocalBackend {
    cluster: ClusterName,
    slots: u32,
    /// Memory of the cluster for launchers, if it is counted.
    memory_mb: Option<u64>,
    /// Slots of one launcher: 1 for a launcher per core, more for one per node.
    launcher_slots: u32,
    command: LauncherCommand,
    launchers: Vec<Launcher>,
    components: Vec<Component>,
    next_id: u64,
    /// A cgroup per launcher, killed when it ends.
    cgroups: Cgroups,
    /// This kcm's account, which runs components (and launchers of no
    /// other account).
    account: String,
    /// Where the kcm claims its launchers' GPUs; `None` where it cannot,
    /// and launchers claim their own.
    claims: Option<GpuClaims>,
}

/// The pid of the kcm that started a launcher, from its placeholder id
/// (`naming::local_launcher_batch_id`).
fn kcm_of(placeholder: &str) -> Option<i32> {
    placeholder
        .strip_prefix('l')
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(pid, _)| pid.parse().ok())
}

/// Whether the kcm with this pid is gone (a zombie is: it runs nothing
/// any more).
fn kcm_is_gone(pid: i32) -> bool {
    let zombie = procfs::process::Process::new(pid)
        .and_then(|process| process.stat())
        .is_ok_and(|stat| stat.state == 'Z');
    zombie || kill(Pid::from_raw(pid), None).is_err()
}

/// The launcher cgroups to end: this kcm's (`own`) whose launcher is no
/// longer running, and those of kcms that are gone (killed, their
/// launchers' leftovers still there). Another live kcm's are its own.
fn leftovers<'a>(
    cgroups: &'a [String],
    running: &[&str],
    own: Option<i32>,
    is_gone: impl Fn(i32) -> bool,
) -> Vec<&'a str> {
    cgroups
        .iter()
        .map(String::as_str)
        .filter(|placeholder| match kcm_of(placeholder) {
            Some(kcm) if Some(kcm) == own => !running.contains(placeholder),
            Some(kcm) => is_gone(kcm),
            None => false,
        })
        .collect()
}

impl LocalBackend {
    pub fn new(
        cluster: &ClusterName,
        slots: u32,
        memory_mb: Option<u64>,
        launcher_slots: u32,
        command: LauncherCommand,
    ) -> Self {
        Self {
            cluster: cluster.clone(),
            slots,
            memory_mb,
            launcher_slots: launcher_slots.max(1),
            command,
            launchers: Vec::new(),
            components: Vec::new(),
            next_id: 0,
            cgroups: Cgroups::new(cluster.as_str()),
            account: account_name(),
            claims: None,
        }
        .with_claims()
    }

    /// Claims GPUs for its launchers if it has any to give: where it
    /// cannot, each launcher claims its own, as on a batch system's host.
    fn with_claims(mut self) -> Self {
        if self.command.gpu_devices.is_empty() {
            return self;
        }
        match GpuClaims::for_host() {
            Ok(claims) => {
                debug!(cluster = %self.cluster, claims = %claims.path().display(), "the kcm claims its launchers' GPUs");
                self.claims = Some(claims);
            }
            Err(e) => {
                warn!(cluster = %self.cluster, error = %e, "cannot keep GPU claims of the kcm's own: launchers claim their GPUs themselves, as any user's process could");
            }
        }
        self
    }

    /// Claims for a launcher that needs `gpus`: the kcm's, to hand over;
    /// none where launchers claim their own (or need none). `None` if too
    /// few devices are free.
    fn claim_gpus(&self, gpus: u32) -> Option<Vec<Claim>> {
        match &self.claims {
            Some(claims) if gpus > 0 => claims.claim_some(&self.command.gpu_devices, gpus),
            _ => Some(Vec::new()),
        }
    }

    fn reap(&mut self) {
        self.launchers
            .retain_mut(|l| matches!(l.child.try_wait(), Ok(None)));
        let running: Vec<&str> = self.launchers.iter().map(|l| l.id.as_str()).collect();
        let own = i32::try_from(std::process::id()).ok();
        for placeholder in leftovers(&self.cgroups.remaining(), &running, own, kcm_is_gone) {
            self.cgroups.end(placeholder);
        }
        let cgroups = &self.cgroups;
        self.components.retain_mut(|c| match &mut c.child {
            Some(child) => {
                let running = matches!(child.try_wait(), Ok(None));
                if !running {
                    // What its command left behind goes with it.
                    cgroups.end(&c.id);
                }
                running
            }
            None => true,
        });
        self.start_components();
    }

    fn component_slots(&self, running: bool) -> u32 {
        self.components
            .iter()
            .filter(|c| c.child.is_some() == running)
            .map(|c| c.spec.slots)
            .sum()
    }

    /// Starts waiting components, first come first served, as slots allow.
    fn start_components(&mut self) {
        loop {
            let used: u32 =
                self.launchers.iter().map(|l| l.slots).sum::<u32>() + self.component_slots(true);
            let free = self.slots.saturating_sub(used);
            let Some(next) = self.components.iter_mut().find(|c| c.child.is_none()) else {
                return;
            };
            if next.spec.slots > free {
                return;
            }
            let mut command = Command::new("/bin/sh");
            command
                .arg("-c")
                .arg(&next.script)
                .stdin(Stdio::null())
                .process_group(0)
                .kill_on_drop(true);
            // In a cgroup of its own: its command runs in a session of its
            // own (to be signalled as a whole), which a process group kill
            // would miss.
            let cgroup = self.cgroups.make(&next.id);
            let procs = cgroup.as_ref().map(contain::Entry::fd);
            // SAFETY: `join` only writes to an open descriptor.
            unsafe {
                command.pre_exec(move || match procs {
                    Some(procs) => contain::join(procs),
                    None => Ok(()),
                });
            }
            match command.spawn() {
                Ok(child) => next.child = Some(child),
                Err(_) => {
                    // Cannot even start a shell: drop it; the kcm reports it ended.
                    let id = next.id.clone();
                    self.cgroups.end(&id);
                    self.components.retain(|c| c.id != id);
                }
            }
        }
    }

    /// A free run of up to `want` slots: its first slot and its length.
    /// Slots running or awaited by grid components are not free.
    /// The first run of free slots that holds at least one task of
    /// `task_slots`: its first slot, and up to `want` of it in whole tasks.
    fn free_slots(&self, want: u32, task_slots: u32) -> Option<(u32, u32)> {
        let used = |slot: u32| {
            self.launchers
                .iter()
                .any(|l| (l.slot..l.slot + l.slots).contains(&slot))
        };
        let components = self.component_slots(true) + self.component_slots(false);
        let launcher_room = self.slots.saturating_sub(components);
        let task_slots = task_slots.max(1);
        let mut first = 0;
        while first < launcher_room {
            if used(first) {
                first += 1;
                continue;
            }
            let run = (first..launcher_room).take_while(|s| !used(*s)).count() as u32;
            let length = run.min(want);
            let length = length - length % task_slots;
            if length > 0 {
                return Some((first, length));
            }
            first += run;
        }
        None
    }

    /// Whole tasks of `task` that the memory and GPUs no launcher holds
    /// fit (`u32::MAX` where it needs neither).
    fn tasks_that_fit(&self, task: TaskShape) -> u32 {
        let held = self.held();
        let by_memory = match (self.memory_mb, task.needs.memory_mb) {
            (Some(total), need) if need > 0 => {
                u32::try_from(total.saturating_sub(held.memory_mb) / need).unwrap_or(u32::MAX)
            }
            _ => u32::MAX,
        };
        let by_gpus = match task.needs.gpus {
            0 => u32::MAX,
            need => self.gpus().saturating_sub(held.gpus) / need,
        };
        by_memory.min(by_gpus)
    }

    /// GPUs of the cluster: those its launchers claim from.
    fn gpus(&self) -> u32 {
        u32::try_from(self.command.gpu_devices.len()).unwrap_or(u32::MAX)
    }

    /// Memory and GPUs the launchers hold.
    fn held(&self) -> Needs {
        self.launchers.iter().map(|l| l.needs).sum()
    }

    fn signal(&self, launcher: &Launcher, signal: Signal) {
        if let Some(pid) = launcher.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }
}

/// Keeps a claim's descriptor open across the launcher's `exec`, in the
/// child between fork and exec.
fn inherit(fd: i32) -> std::io::Result<()> {
    // SAFETY: the kcm's claim, open until after the spawn.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map(drop)
    .map_err(std::io::Error::from)
}

/// This machine's name, as the launchers it starts report it.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// This process's account (its effective user), by the name batch systems
/// give the owner of the jobs it submits; its number if it has no name,
/// which then matches no owner.
pub fn account_name() -> String {
    let uid = nix::unistd::geteuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |user| user.name)
}

impl Backend for LocalBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn launcher_command(&self) -> &LauncherCommand {
        &self.command
    }

    async fn snapshot(&mut self) -> Result<Snapshot, BackendError> {
        self.reap();
        let host = hostname();
        let held = self.held();
        Ok(Snapshot {
            hosts: vec![Host {
                grid: self.component_slots(true),
                free_memory_mb: self.memory_mb.map(|m| m.saturating_sub(held.memory_mb)),
                // Counted even when there are none: a GPU job gets nothing here.
                free_gpus: Some(self.gpus().saturating_sub(held.gpus)),
                ..Host::new(host.clone(), self.slots)
            }],
            components: self
                .components
                .iter()
                .map(|c| ComponentRun {
                    id: c.id.clone(),
                    job: c.spec.job.clone(),
                    component: c.spec.component,
                    slots: c.spec.slots,
                    running: c.child.is_some(),
                    owner: self.account.clone(),
                    timing: Timing {
                        slots: c.spec.slots,
                        running: c.child.is_some(),
                        limit_ms: c.spec.walltime_ms,
                        start: None,
                    },
                })
                .collect(),
            placeholders: self
                .launchers
                .iter()
                .map(|l| Placeholder {
                    id: l.id.clone(),
                    job: l.job.clone(),
                    slots: l.slots,
                    host: Some(host.clone()),
                    owner: l.owner.clone(),
                    needs: l.needs,
                })
                .collect(),
            ..Snapshot::default()
        })
    }

    async fn submit(
        &mut self,
        job: &JobId,
        slots: u32,
        task: TaskShape,
        run_as: Option<RunAs<'_>>,
    ) -> Result<u32, BackendError> {
        let launcher = self.command.for_run_as(run_as);
        let run_as = run_as.map(|r| r.account).filter(|a| !a.is_me()).cloned();
        self.reap();
        let task_slots = task.slots.max(1);
        let mut started = 0;
        while started < slots {
            let size = task_slots * (self.launcher_slots / task_slots).max(1);
            let fit = self.tasks_that_fit(task).saturating_mul(task_slots);
            let want = size.min(slots - started).min(fit);
            let Some((slot, length)) = self.free_slots(want, task_slots) else {
                break;
            };
            let Some(claims) = self.claim_gpus(task.needs_of(length).gpus) else {
                // Held by launchers an earlier kcm left: they are not free.
                break;
            };
            let claimed: Vec<String> = claims.iter().map(|c| c.device.clone()).collect();
            let claim_fds: Vec<i32> = claims.iter().map(|c| c.file.as_raw_fd()).collect();
            let id = local_launcher_batch_id(std::process::id(), self.next_id);
            self.next_id += 1;
            let args = launcher.arguments(&LauncherArgs {
                job: job.as_str(),
                cluster: self.cluster.as_str(),
                id: launcher_id(&self.cluster, &id).as_str(),
                slot: &slot.to_string(),
                slots: length,
                task_slots,
                task_needs: task.needs,
                gpu_devices: match claims.is_empty() {
                    true => &launcher.gpu_devices,
                    false => &claimed,
                },
                gpu_claims: &claim_fds,
                walltime: None,
                ends_at: None,
            });
            let mut command = Command::new(&launcher.program);
            if run_as.is_some() {
                // Nor what the kcm itself was started with.
                for key in kcm_only() {
                    command.env_remove(key);
                }
            }
            command
                .args(&args)
                .envs(launcher.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .kill_on_drop(true);
            let cgroup = self.cgroups.make(&id);
            if let Some(account) = &run_as
                && cgroup.is_some()
            {
                self.cgroups.delegate(&id, account);
            }
            let procs = cgroup.as_ref().map(contain::Entry::fd);
            if let Some(account) = &run_as {
                command.envs(account.environment());
            }
            let account = run_as.clone();
            let inherited = claim_fds.clone();
            // SAFETY: `join` only writes to an open descriptor, `inherit`
            // only changes the flags of the claims' open descriptors, and
            // `become_it` only makes system calls on data looked up
            // before the fork. The cgroup is joined as the kcm, which may.
            unsafe {
                command.pre_exec(move || {
                    if let Some(procs) = procs {
                        contain::join(procs)?;
                    }
                    for fd in &inherited {
                        inherit(*fd)?;
                    }
                    match &account {
                        Some(account) => account.become_it(),
                        None => Ok(()),
                    }
                });
            }
            let child = command.spawn().map_err(|e| BackendError {
                command: format!("{} {}", launcher.program.display(), args.join(" ")),
                message: e.to_string(),
            })?;
            // The launcher holds the claims now; the kcm's copies go.
            drop(claims);
            self.launchers.push(Launcher {
                id,
                job: job.clone(),
                owner: run_as
                    .as_ref()
                    .map_or_else(|| self.account.clone(), |a| a.name.clone()),
                slot,
                slots: length,
                needs: task.needs_of(length),
                child,
            });
            started += length;
        }
        Ok(started)
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        for launcher in self.launchers.iter().filter(|l| ids.contains(&l.id)) {
            self.signal(launcher, Signal::SIGKILL);
            self.cgroups.end(&launcher.id);
        }
        for component in self.components.iter_mut().filter(|c| ids.contains(&c.id)) {
            if let Some(pid) = component.child.as_ref().and_then(Child::id) {
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            self.cgroups.end(&component.id);
        }
        self.components
            .retain(|c| !(ids.contains(&c.id) && c.child.is_none()));
        self.reap();
        Ok(())
    }

    fn components_as_owner(&self) -> bool {
        false
    }

    async fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
        _one_host: bool,
        run_as: Option<&Account>,
    ) -> Result<(), BackendError> {
        let id = local_component_batch_id(std::process::id(), self.next_id);
        self.next_id += 1;
        self.components.push(Component {
            id,
            spec: spec.clone(),
            script: files.script(spec, run_as, ComponentHosts::ThisHost),
            child: None,
        });
        self.start_components();
        Ok(())
    }

    /// Launchers get SIGTERM (they republish their running tasks) and a
    /// moment to leave; what is left is killed.
    async fn shutdown(&mut self) {
        for launcher in &self.launchers {
            self.signal(launcher, Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for launcher in &mut self.launchers {
            if tokio::time::timeout_at(deadline, launcher.child.wait())
                .await
                .is_err()
            {
                let _ = launcher.child.start_kill();
            }
            self.cgroups.end(&launcher.id);
        }
        self.launchers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local cluster of `devices` whose launcher is a script that
    /// writes its arguments to `args` and waits.
    fn gpu_backend(
        devices: &[&str],
        claims: &std::path::Path,
        args: &std::path::Path,
    ) -> LocalBackend {
        let command = LauncherCommand {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("echo \"$@\" > {}; exec sleep 30", args.display()),
                "launcher".into(),
            ],
            env: Vec::new(),
            broker_urls: Vec::new(),
            launcher_settings: String::new(),
            gpu_devices: Vec::new(),
        };
        // Claiming in `claims`, not the host's directory.
        let mut backend = LocalBackend::new(&"c1".into(), 4, None, 1, command);
        backend.command.gpu_devices = devices.iter().map(|d| d.to_string()).collect();
        backend.claims = Some(GpuClaims::open(claims, "gpus").unwrap());
        backend
    }

    #[tokio::test]
    async fn a_launcher_holds_the_gpus_its_kcm_claimed_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let args = dir.path().join("args");
        let mut backend = gpu_backend(&["0", "1"], dir.path(), &args);
        let claims = GpuClaims::open(dir.path(), "gpus").unwrap();
        // A launcher an earlier kcm left holds device 0.
        let leftover = claims.claim("0").unwrap();
        let job: JobId = "gpu-0000000000000000".parse().unwrap();
        let one_gpu = TaskShape {
            slots: 1,
            needs: Needs {
                memory_mb: 0,
                gpus: 1,
            },
        };
        assert_eq!(backend.submit(&job, 2, one_gpu, None).await.unwrap(), 1);
        let mut written = String::new();
        for _ in 0..100 {
            written = std::fs::read_to_string(&args).unwrap_or_default();
            if !written.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            written.contains("--gpu-devices 1 --gpu-claims "),
            "{written}"
        );
        assert!(
            claims.claim("1").is_none(),
            "the launcher holds it, the kcm no longer"
        );
        let ids: Vec<String> = backend.launchers.iter().map(|l| l.id.clone()).collect();
        backend.remove(&ids).await.unwrap();
        drop(leftover);
        let mut free = None;
        for _ in 0..100 {
            free = claims.claim("1");
            if free.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(free.is_some(), "gone with the launcher");
    }

    #[test]
    fn a_placeholder_names_its_kcm() {
        let id = local_launcher_batch_id(4242, 7);
        assert_eq!(kcm_of(&id), Some(4242));
        assert_eq!(kcm_of("c4242-7"), None);
    }

    #[test]
    fn ended_launchers_and_gone_kcms_leave_cgroups_to_end() {
        let cgroups: Vec<String> = ["l10-0", "l10-1", "l20-0", "l30-0", "stray"]
            .map(String::from)
            .to_vec();
        // This kcm is 10 and runs l10-1; kcm 20 is gone, kcm 30 lives.
        let ended = leftovers(&cgroups, &["l10-1"], Some(10), |pid| pid == 20);
        assert_eq!(ended, ["l10-0", "l20-0"]);
    }
}
