//! Containment of the local backend's launchers: each runs in a cgroup (v2)
//! of its own, so that when it ends — or is killed with SIGKILL, which it
//! cannot act on — whatever it and its tasks started is killed with it.
//! A launcher's own subreaper and task cgroups catch its tasks' strays while
//! it lives; this catches everything once it is gone.
//!
//! The cgroups live under the kcm's own cgroup (a systemd unit gives it
//! with `Delegate=yes`): `<kcm's cgroup>/gleaner/<cluster>/<placeholder>`.
//! Where cgroup v2 is not mounted or not writable, launchers run without
//! (and the kcm says so once).

use std::path::Path;

use gleaner_contain::Tree;
pub use gleaner_contain::{Account, Entry, join};
use tracing::warn;

/// The cgroups of one cluster's launchers.
#[derive(Debug)]
pub struct Cgroups {
    /// `None`: no cgroup v2 here that the kcm may use.
    tree: Option<Tree>,
}

impl Cgroups {
    /// The cluster's cgroup directory, made if needed. Where it cannot be,
    /// the kcm says so once and launchers run without.
    pub fn new(cluster: &str) -> Self {
        let tree = Tree::under_own(&Path::new("gleaner").join(cluster))
            .inspect_err(|e| {
                warn!(cluster, error = %e, "no cgroups for launchers: what a killed launcher's tasks started may outlive it");
            })
            .ok();
        Self { tree }
    }

    /// A cgroup for a launcher about to start, for its process to join.
    pub fn make(&self, placeholder: &str) -> Option<Entry> {
        self.tree
            .as_ref()?
            .make(placeholder)
            .inspect_err(|e| warn!(placeholder, error = %e, "cannot make the launcher's cgroup"))
            .ok()
    }

    /// Hands a launcher's cgroup to the account it runs as, so that it can
    /// give each task a cgroup of its own; without, its tasks run without.
    pub fn delegate(&self, placeholder: &str, account: &Account) {
        if let Some(tree) = &self.tree
            && let Err(e) = tree.delegate(placeholder, account)
        {
            warn!(placeholder, account = %account.name, error = %e, "cannot hand the launcher's cgroup to its account");
        }
    }

    /// Kills everything left in a launcher's cgroup and removes it (at a
    /// later call if its processes are not all gone yet).
    pub fn end(&self, placeholder: &str) {
        if let Some(tree) = &self.tree {
            tree.end(placeholder);
        }
    }

    /// Placeholders whose cgroup is still there.
    pub fn remaining(&self) -> Vec<String> {
        self.tree.as_ref().map(Tree::remaining).unwrap_or_default()
    }
}

impl Drop for Cgroups {
    /// The cluster's directory, and `gleaner` above it, go once empty.
    fn drop(&mut self) {
        if let Some(tree) = &self.tree {
            tree.remove_empty(1);
        }
    }
}
