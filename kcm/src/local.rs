//! The embedded default: launchers are child processes of the kcm, within a
//! fixed number of slots. Lets `gleaner up` work with nothing but RabbitMQ.

use std::{process::Stdio, time::Duration};

use gleaner_manifest::JobId;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::process::{Child, Command};

use gleaner_protocol::{
    ClusterName, ComponentSpec,
    naming::{LauncherArgs, launcher_id, local_component_batch_id, local_launcher_batch_id},
};

use crate::{
    backend::{Backend, BackendError, ComponentFiles, LauncherCommand},
    snapshot::{ComponentRun, Host, Placeholder, Snapshot},
};

struct Launcher {
    id: String,
    job: JobId,
    /// The first of its slots, which names it in the consumer tag.
    slot: u32,
    slots: u32,
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
    /// Slots of one launcher: 1 for a launcher per core, more for one per node.
    launcher_slots: u32,
    command: LauncherCommand,
    launchers: Vec<Launcher>,
    components: Vec<Component>,
    next_id: u64,
}

impl LocalBackend {
    pub fn new(
        cluster: &ClusterName,
        slots: u32,
        launcher_slots: u32,
        command: LauncherCommand,
    ) -> Self {
        Self {
            cluster: cluster.clone(),
            slots,
            launcher_slots: launcher_slots.max(1),
            command,
            launchers: Vec::new(),
            components: Vec::new(),
            next_id: 0,
        }
    }

    fn reap(&mut self) {
        self.launchers
            .retain_mut(|l| matches!(l.child.try_wait(), Ok(None)));
        self.components.retain_mut(|c| match &mut c.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
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
            match Command::new("/bin/sh")
                .arg("-c")
                .arg(&next.script)
                .stdin(Stdio::null())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
            {
                Ok(child) => next.child = Some(child),
                Err(_) => {
                    // Cannot even start a shell: drop it; the kcm reports it ended.
                    let id = next.id.clone();
                    self.components.retain(|c| c.id != id);
                }
            }
        }
    }

    /// A free run of up to `want` slots: its first slot and its length.
    /// Slots running or awaited by grid components are not free.
    fn free_slots(&self, want: u32) -> Option<(u32, u32)> {
        let used = |slot: u32| {
            self.launchers
                .iter()
                .any(|l| (l.slot..l.slot + l.slots).contains(&slot))
        };
        let components = self.component_slots(true) + self.component_slots(false);
        let launcher_room = self.slots.saturating_sub(components);
        let first = (0..launcher_room).find(|s| !used(*s))?;
        let length = (first..launcher_room)
            .take(want as usize)
            .take_while(|s| !used(*s))
            .count() as u32;
        Some((first, length))
    }

    fn signal(&self, launcher: &Launcher, signal: Signal) {
        if let Some(pid) = launcher.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }
}

/// This machine's name, as the launchers it starts report it.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

impl Backend for LocalBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn snapshot(&mut self) -> Result<Snapshot, BackendError> {
        self.reap();
        let host = hostname();
        Ok(Snapshot {
            hosts: vec![Host {
                grid: self.component_slots(true),
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
                })
                .collect(),
            ..Snapshot::default()
        })
    }

    async fn submit(&mut self, job: &JobId, slots: u32) -> Result<u32, BackendError> {
        self.reap();
        let mut started = 0;
        while started < slots {
            let want = self.launcher_slots.min(slots - started);
            let Some((slot, length)) = self.free_slots(want) else {
                break;
            };
            let id = local_launcher_batch_id(std::process::id(), self.next_id);
            self.next_id += 1;
            let args = self.command.arguments(&LauncherArgs {
                job: job.as_str(),
                cluster: self.cluster.as_str(),
                id: launcher_id(&self.cluster, &id).as_str(),
                slot: &slot.to_string(),
                slots: length,
                walltime: None,
            });
            let child = Command::new(&self.command.program)
                .args(&args)
                .envs(self.command.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| BackendError {
                    command: format!("{} {}", self.command.program.display(), args.join(" ")),
                    message: e.to_string(),
                })?;
            self.launchers.push(Launcher {
                id,
                job: job.clone(),
                slot,
                slots: length,
                child,
            });
            started += length;
        }
        Ok(started)
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        for launcher in self.launchers.iter().filter(|l| ids.contains(&l.id)) {
            self.signal(launcher, Signal::SIGKILL);
        }
        for component in self.components.iter_mut().filter(|c| ids.contains(&c.id)) {
            if let Some(pid) = component.child.as_ref().and_then(Child::id) {
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        self.components
            .retain(|c| !(ids.contains(&c.id) && c.child.is_none()));
        self.reap();
        Ok(())
    }

    async fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
        _one_host: bool,
    ) -> Result<(), BackendError> {
        let id = local_component_batch_id(std::process::id(), self.next_id);
        self.next_id += 1;
        self.components.push(Component {
            id,
            spec: spec.clone(),
            script: files.script(spec),
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
        }
        self.launchers.clear();
    }
}
