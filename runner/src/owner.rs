//! Whose a job is, and writing its results as them.
//!
//! With many users, a job's results live in its owner's area
//! (`results_root/<account>/…`, mode 0700) and every file there is written
//! with the owner's filesystem identity (`setfsuid`/`setfsgid`, this thread
//! only) and none of root's capabilities, so the files are theirs, a
//! symlink they plant in their own area cannot lead the runner anywhere
//! they could not write themselves, and their quota holds.

use std::{io, path::Path};

pub use gleaner_contain::Account;
use nix::unistd::{Gid, Uid};

/// Whose a job is: the broker user, and, when users are kept apart, their
/// Unix account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub account: Option<Account>,
}

impl Owner {
    /// Where the job's results go: `results` under the owner's area, or
    /// straight under `results_root` when there is one user.
    pub fn results_dir(&self, results_root: &Path, results: &Path) -> std::path::PathBuf {
        let account = self.account.as_ref().map(|a| a.name.as_str());
        gleaner_policy::access::results_area(results_root, account).join(results)
    }
}

/// Runs `f` with `account`'s filesystem identity on this thread (as the
/// runner itself without one): its uid and gid for the file system, its
/// supplementary groups, not root's, and no effective capability. The
/// kernel drops the file system's capabilities when the fsuid leaves
/// root, but not the others, and `CAP_SYS_RESOURCE` alone writes past
/// the owner's disk quota and into the blocks a file system keeps for
/// root. `f` must not await: the identity belongs to the thread, not the
/// task.
pub fn as_account<T>(account: Option<&Account>, f: impl FnOnce() -> T) -> T {
    let Some(account) = account else {
        return f();
    };
    let _restore = FsIdentity::assume(account);
    f()
}

/// The filesystem identity in force, restored when dropped.
struct FsIdentity {
    uid: Uid,
    gid: Gid,
    groups: Option<Vec<Gid>>,
    /// The thread's effective capabilities, if they were cleared.
    effective: Option<caps::CapsHashSet>,
}

impl FsIdentity {
    fn assume(account: &Account) -> Self {
        // Read before the fsuid leaves root, which clears some of them.
        let effective = caps::read(None, caps::CapSet::Effective);
        // Groups first, while the fsuid is still root's.
        let groups = nix::unistd::getgroups().ok();
        let groups = match gleaner_contain::set_thread_groups(&account.groups) {
            Ok(()) => groups,
            Err(e) => {
                tracing::warn!(account = %account.name, error = %e, "cannot take the owner's groups for writing results; keeping the runner's");
                None
            }
        };
        // Group next: once the uid is not root, the gid cannot change.
        let gid = nix::unistd::setfsgid(account.gid);
        let uid = nix::unistd::setfsuid(account.uid);
        // Last, as the switches above need theirs. The permitted set
        // stays, so they can be raised again.
        let effective = match effective
            .and_then(|effective| caps::clear(None, caps::CapSet::Effective).map(|()| effective))
        {
            Ok(effective) => Some(effective),
            Err(e) => {
                tracing::warn!(account = %account.name, error = %e, "cannot drop the runner's capabilities for writing results; writing with them");
                None
            }
        };
        Self {
            uid,
            gid,
            groups,
            effective,
        }
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // First: giving the groups back takes CAP_SETGID.
        if let Some(effective) = &self.effective
            && let Err(e) = caps::set(None, caps::CapSet::Effective, effective)
        {
            tracing::error!(error = %e, "cannot restore the runner's capabilities on this thread");
        }
        nix::unistd::setfsuid(self.uid);
        nix::unistd::setfsgid(self.gid);
        if let Some(groups) = &self.groups
            && let Err(e) = gleaner_contain::set_thread_groups(groups)
        {
            tracing::error!(error = %e, "cannot restore the runner's groups on this thread");
        }
    }
}

/// The first symbolic link on the way from `base` down `relative`, if
/// any: a results directory must be where the manifest says, not wherever a
/// link points.
pub fn symlink_on_the_way(base: &Path, relative: &Path) -> Option<std::path::PathBuf> {
    let mut path = base.to_path_buf();
    for part in relative.components() {
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => return Some(path),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// Makes `dir` (`results_root/<account>`) the owner's private area: created
/// for them with mode 0700, or, if it exists, a real directory of theirs
/// that nobody else may write to, on a way that only root may change
/// ([`gleaner_contain::shared`]).
pub fn prepare_area(dir: &Path, account: &Account) -> io::Result<()> {
    let (Some(root), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str())) else {
        return Err(io::Error::other(format!(
            "{} is not an area",
            dir.display()
        )));
    };
    std::fs::create_dir_all(root)?;
    // Nobody else may add an entry to it, sticky or not: they could
    // take an account's name before the account's first job.
    gleaner_contain::shared::open_private(root, nix::unistd::geteuid())
        .map_err(|e| io::Error::other(format!("results_root: {e}")))?;
    gleaner_contain::shared::private_dir(
        root,
        name,
        (account.uid, account.gid),
        nix::unistd::geteuid(),
        0o700,
    )
    .map(|_| ())
    .map_err(|e| io::Error::other(format!("results_root: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_may_not_pass_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/tmp", dir.path().join("a/l")).unwrap();
        assert_eq!(symlink_on_the_way(dir.path(), Path::new("a/b/c")), None);
        assert_eq!(
            symlink_on_the_way(dir.path(), Path::new("a/l/c")),
            Some(dir.path().join("a/l"))
        );
    }

    /// This thread's effective capabilities, as the kernel shows them.
    fn effective() -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap()
    }

    #[test]
    fn the_owners_writes_have_none_of_roots_capabilities() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let owner = Account {
            name: "owner".into(),
            uid: Uid::from_raw(54_321),
            gid: Gid::from_raw(54_321),
            groups: vec![Gid::from_raw(54_321)],
            home: "/nonexistent".into(),
        };
        const SYS_RESOURCE: u64 = 1 << 24;
        std::thread::spawn(move || {
            let before = effective();
            let (inside, fsuid) = as_account(Some(&owner), || {
                let fsuid = nix::unistd::setfsuid(Uid::from_raw(54_321));
                (effective(), fsuid)
            });
            assert_eq!(fsuid, owner.uid, "written as the owner");
            assert_eq!(inside & SYS_RESOURCE, 0, "no quota lifted");
            assert_eq!(inside, 0, "no capability at all: {inside:x}");
            assert_eq!(effective(), before, "the runner's own again");
            assert!(nix::unistd::setfsuid(Uid::from_raw(0)).is_root());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn without_an_account_the_runner_writes_as_itself() {
        assert_eq!(as_account(None, || 7), 7);
    }
}
