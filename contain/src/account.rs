//! Running as a job's owner: their Unix account, looked up once, and the
//! switch to it between fork and exec.

use nix::unistd::{Gid, Uid, User};

/// A job owner's Unix account, with everything the switch to it needs
/// looked up beforehand (between fork and exec nothing may be looked up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups, as `initgroups` would set them.
    pub groups: Vec<Gid>,
    pub home: std::path::PathBuf,
}

impl Account {
    /// The account named `name` on this host. Root never owns jobs.
    pub fn lookup(name: &str) -> Result<Self, String> {
        let user = User::from_name(name)
            .map_err(|e| format!("cannot look up Unix account {name:?}: {e}"))?
            .ok_or_else(|| format!("there is no Unix account {name:?} on this host"))?;
        if user.uid.is_root() {
            return Err(format!("{name:?} is root, which never owns jobs"));
        }
        let c_name = std::ffi::CString::new(name)
            .map_err(|_| format!("{name:?} cannot be an account name"))?;
        let groups = nix::unistd::getgrouplist(&c_name, user.gid)
            .map_err(|e| format!("cannot read the groups of {name:?}: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            uid: user.uid,
            gid: user.gid,
            groups,
            home: user.dir,
        })
    }

    /// What a login as this account would set in the environment.
    pub fn environment(&self) -> [(&'static str, std::ffi::OsString); 3] {
        [
            ("HOME", self.home.clone().into_os_string()),
            ("USER", self.name.clone().into()),
            ("LOGNAME", self.name.clone().into()),
        ]
    }

    /// Whether this process is already this account (nothing to switch).
    pub fn is_me(&self) -> bool {
        nix::unistd::geteuid() == self.uid
    }

    /// Becomes this account: groups, then group, then user, so that none
    /// of root's stays. Called between fork and exec: plain system calls
    /// on what [`Account::lookup`] found, no allocation.
    pub fn become_it(&self) -> std::io::Result<()> {
        nix::unistd::setgroups(&self.groups)?;
        nix::unistd::setgid(self.gid)?;
        nix::unistd::setuid(self.uid)?;
        Ok(())
    }
}

/// Sets this thread's supplementary groups alone, for a thread that takes
/// an account's file system identity for a while (`setfsuid`). The C
/// library's `setgroups` sets every thread's, which would hand the
/// account's groups to the process's other threads meanwhile; the system
/// call sets the caller's.
pub fn set_thread_groups(groups: &[Gid]) -> nix::Result<()> {
    let raw: Vec<nix::libc::gid_t> = groups.iter().map(|g| g.as_raw()).collect();
    // SAFETY: the pointer and length describe `raw`, alive for the call.
    let done = unsafe { nix::libc::syscall(nix::libc::SYS_setgroups, raw.len(), raw.as_ptr()) };
    nix::errno::Errno::result(done).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_never_owns_jobs() {
        assert!(Account::lookup("root").unwrap_err().contains("root"));
        assert!(
            Account::lookup("no-such-user-here")
                .unwrap_err()
                .contains("no Unix account")
        );
    }

    fn groups_of(status: &str) -> String {
        std::fs::read_to_string(status)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    #[test]
    fn a_threads_groups_are_its_own() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let before = groups_of("/proc/thread-self/status");
        let (theirs, after) = std::thread::spawn(|| {
            set_thread_groups(&[Gid::from_raw(54_321)]).unwrap();
            let theirs = groups_of("/proc/thread-self/status");
            set_thread_groups(&[]).unwrap();
            (theirs, groups_of("/proc/thread-self/status"))
        })
        .join()
        .unwrap();
        assert_eq!(theirs, "54321");
        assert_eq!(after, "");
        assert_eq!(
            groups_of("/proc/thread-self/status"),
            before,
            "not the others'"
        );
    }
}
