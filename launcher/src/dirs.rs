//! The directories a task gets: a sandbox of its slot's, emptied and
//! reused from task to task, and a checkpoint directory of its own that
//! outlives its runs.

use std::{
    path::PathBuf,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::exec;

/// One sandbox directory per slot, emptied and reused from task to task.
pub struct Sandboxes {
    root: PathBuf,
    free: Mutex<Vec<PathBuf>>,
    made: AtomicU64,
}

impl Sandboxes {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            free: Mutex::default(),
            made: Default::default(),
        }
    }

    pub fn take(&self) -> PathBuf {
        if let Some(dir) = self.free.lock().ok().and_then(|mut free| free.pop()) {
            return dir;
        }
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        self.root.join(format!("s{n}"))
    }

    pub fn give_back(&self, dir: PathBuf) {
        if exec::reset_sandbox(&dir) {
            if let Ok(mut free) = self.free.lock() {
                free.push(dir);
            }
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Leaves the node as it was found.
    pub fn remove_all(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Each task's `$GLEANER_CHECKPOINT`: `<checkpoints>/<job>/<task>`, kept
/// across its runs until it has ended for good. Most tasks never write to
/// it, and making and removing a directory costs the file system an inode
/// per task: an empty one is renamed back to a spare of this launcher's,
/// in the job's directory, and the next task's is renamed from it.
pub struct Checkpoints {
    job: PathBuf,
    launcher: String,
    spares: Mutex<Vec<PathBuf>>,
    made: AtomicU64,
}

impl Checkpoints {
    pub fn new(job: PathBuf, launcher: &str) -> Self {
        Self {
            job,
            launcher: launcher.to_owned(),
            spares: Mutex::default(),
            made: AtomicU64::new(0),
        }
    }

    /// The task's directory: its earlier runs' if it has one, else an
    /// empty one.
    pub fn take(&self, task: u64) -> std::io::Result<PathBuf> {
        let dir = self.job.join(task.to_string());
        let spare = self.spares.lock().ok().and_then(|mut spares| spares.pop());
        if let Some(spare) = spare {
            // Fails where the task's earlier run left state: that is used.
            if std::fs::rename(&spare, &dir).is_ok() {
                return Ok(dir);
            }
            if let Ok(mut spares) = self.spares.lock() {
                spares.push(spare);
            }
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// A task's directory, no longer wanted: kept as a spare if empty.
    pub fn remove(&self, dir: PathBuf) {
        let empty = std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_none());
        if empty {
            let n = self.made.fetch_add(1, Ordering::Relaxed);
            let spare = self.job.join(format!(".spare-{}-{n}", self.launcher));
            if std::fs::rename(&dir, &spare).is_ok() {
                if let Ok(mut spares) = self.spares.lock() {
                    spares.push(spare);
                }
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Removes the spares when the launcher leaves, and the job's
    /// directory with them if nothing else is left in it.
    pub fn remove_spares(&self) {
        if let Ok(mut spares) = self.spares.lock() {
            for spare in spares.drain(..) {
                let _ = std::fs::remove_dir(spare);
            }
        }
        let _ = std::fs::remove_dir(&self.job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_are_kept_until_removed_and_empty_ones_are_reused() {
        let root = tempfile::tempdir().unwrap();
        let job = root.path().join("job-1");
        let checkpoints = Checkpoints::new(job.clone(), "l1");
        let first = checkpoints.take(0).unwrap();
        assert_eq!(first, job.join("0"));
        std::fs::write(first.join("state"), "3").unwrap();
        // Its next run finds its state, even with a spare at hand.
        let empty = checkpoints.take(1).unwrap();
        checkpoints.remove(empty);
        let again = checkpoints.take(0).unwrap();
        assert_eq!(std::fs::read_to_string(again.join("state")).unwrap(), "3");
        // The spare went to the next new task, and came back.
        let second = checkpoints.take(2).unwrap();
        assert!(second.is_dir() && !job.join("1").exists());
        checkpoints.remove(second);
        checkpoints.remove(again);
        assert!(!job.join("0").exists(), "a task's state goes once it ended");
        checkpoints.remove_spares();
        assert!(!job.exists(), "nothing left behind");
    }
}
