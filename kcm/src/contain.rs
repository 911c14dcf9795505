//! Containment of the local backend's launchers: each runs in a cgroup (v2)
//! of its own, so that when it ends — or is killed with SIGKILL, which it
//! cannot act on — whatever it and its tasks started is killed with it.
//! A launcher's own subreaper catches its tasks' strays while it lives;
//! this catches everything once it is gone.
//!
//! The cgroups live under the kcm's own cgroup (a systemd unit gives it
//! with `Delegate=yes`): `<kcm's cgroup>/gleaner/<cluster>/<placeholder>`.
//! Where cgroup v2 is not mounted or not writable, launchers run without
//! (and the kcm says so once).

use std::{
    io::Write,
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
};

use tracing::{debug, warn};

/// The cgroups of one cluster's launchers.
#[derive(Debug)]
pub struct Cgroups {
    /// `None`: no cgroup v2 here that the kcm may use.
    base: Option<PathBuf>,
}

impl Cgroups {
    /// The cluster's cgroup directory, made if needed. Where it cannot be,
    /// the kcm says so once and launchers run without.
    pub fn new(cluster: &str) -> Self {
        let base = match own_cgroup() {
            None => {
                warn!(
                    cluster,
                    "cgroup v2 is not available: what a killed launcher's tasks started may outlive it"
                );
                None
            }
            Some(own) => {
                let base = own.join("gleaner").join(cluster);
                match std::fs::create_dir_all(&base) {
                    Ok(()) => Some(base),
                    Err(e) => {
                        warn!(cluster, path = %base.display(), error = %e, "no cgroup for launchers: what a killed launcher's tasks started may outlive it");
                        None
                    }
                }
            }
        };
        Self { base }
    }

    /// A cgroup for a launcher about to start: the open `cgroup.procs` file
    /// its process writes itself into before it runs anything.
    pub fn make(&self, placeholder: &str) -> Option<Entry> {
        let dir = self.base.as_ref()?.join(placeholder);
        let made = std::fs::create_dir_all(&dir).and_then(|()| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
        });
        match made {
            Ok(procs) => Some(Entry { procs }),
            Err(e) => {
                warn!(placeholder, error = %e, "cannot make the launcher's cgroup");
                None
            }
        }
    }

    /// Kills everything left in a launcher's cgroup and removes it. A
    /// cgroup whose processes are not all gone yet is removed at a later
    /// call.
    pub fn end(&self, placeholder: &str) {
        let Some(base) = &self.base else { return };
        let dir = base.join(placeholder);
        if !dir.exists() {
            return;
        }
        kill_all(&dir);
        if let Err(e) = std::fs::remove_dir(&dir) {
            debug!(placeholder, error = %e, "launcher cgroup not empty yet");
        }
    }

    /// Placeholders whose cgroup is still there.
    pub fn remaining(&self) -> Vec<String> {
        let Some(base) = &self.base else {
            return Vec::new();
        };
        std::fs::read_dir(base)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Cgroups {
    /// The cluster's directory, and `gleaner` above it, go once empty.
    fn drop(&mut self) {
        if let Some(base) = &self.base
            && std::fs::remove_dir(base).is_ok()
            && let Some(parent) = base.parent()
        {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// A launcher's cgroup, to be joined by its process.
#[derive(Debug)]
pub struct Entry {
    procs: std::fs::File,
}

impl Entry {
    /// The descriptor the child writes its pid to (see [`join`]).
    pub fn fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is open
/// as `fd`. Called between fork and exec: only async-signal-safe calls, no
/// allocation.
pub fn join(fd: RawFd) -> std::io::Result<()> {
    let mut digits = [0u8; 20];
    let mut pid = std::process::id();
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    // SAFETY: `fd` is open for as long as the parent holds its `Entry`,
    // which outlives the spawn.
    let procs = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::unistd::write(procs, &digits[start..])?;
    Ok(())
}

/// SIGKILL to every process of a cgroup: `cgroup.kill` where the kernel
/// has it (5.14), else each pid of `cgroup.procs`, a few rounds.
fn kill_all(dir: &Path) {
    let killed = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.kill"))
        .and_then(|mut kill| kill.write_all(b"1"));
    if killed.is_ok() {
        return;
    }
    for _ in 0..5 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// This process's cgroup v2 directory, if cgroup v2 is mounted.
fn own_cgroup() -> Option<PathBuf> {
    let mount = cgroup2_mount()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on a hybrid system).
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_cgroup2_mount(&mounts)
}

fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        let fstype = rest.split_whitespace().next()?;
        let mount_point = fields.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_on_hybrid_and_unified_systems() {
        let hybrid = "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                      27 25 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(
            parse_cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            parse_cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}
