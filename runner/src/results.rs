//! The results directory of a job: `index.jsonl`, `tasks/<task>/…`, `job.json`.
//!
//! Everything is on disk (and synced) before the messages it came from are
//! acked, and the directory alone is enough to resume a job after a crash.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufReader, Read, Seek, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Component, Path, PathBuf},
};

use gleaner_manifest::Manifest;
use gleaner_protocol::{Captured, OutputFile, ResultMsg};
use tracing::warn;

use crate::{
    book::FinalStatus,
    owner::{Account, as_account},
    records::{AddedTasks, IndexEntry, JobFile, read_additions, read_index},
};

/// The manifest a job ran, in its results directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Tasks added to an open job, one addition per line.
const ADDITIONS_FILE: &str = "additions.jsonl";

pub struct ResultsDir {
    root: PathBuf,
    index: File,
    /// Whose results these are, when users are kept apart: everything is
    /// written as them ([`as_account`]).
    account: Option<Account>,
}

impl ResultsDir {
    /// Opens (creating it if needed) a results directory and reads the tasks
    /// it already has final states for. A line cut short by a crash is dropped.
    pub fn open(
        root: &Path,
        account: Option<&Account>,
    ) -> io::Result<(Self, Vec<(u64, FinalStatus)>)> {
        as_account(account, || {
            std::fs::create_dir_all(root.join("tasks"))?;
            if account.is_some() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
            }
            let path = root.join("index.jsonl");
            let opened = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .custom_flags(nix::libc::O_NONBLOCK)
                .open(&path)?;
            let mut index = regular(opened, &path)?;
            let finished = recover_index(&mut index, root)?;
            Ok((
                Self {
                    root: root.to_path_buf(),
                    index,
                    account: account.cloned(),
                },
                finished,
            ))
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes a run's stdout, stderr and output files under `tasks/<task>/`,
    /// replacing what an earlier attempt left. A task that produced nothing
    /// gets no directory: a million silent tasks should not cost the
    /// filesystem three million inodes.
    /// Under `tasks/<task>/`, or `final/` for the final step.
    pub fn write_outputs(&self, result: &ResultMsg, final_step: bool) -> io::Result<()> {
        let dir = match final_step {
            true => self.root.join("final"),
            false => self.root.join("tasks").join(result.task.to_string()),
        };
        as_account(self.account.as_ref(), || {
            self.write_outputs_here(result, &dir)
        })
    }

    fn write_outputs_here(&self, result: &ResultMsg, dir: &std::path::Path) -> io::Result<()> {
        let dir = dir.to_owned();
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let stderr = stderr_of(result);
        let streams = [("stdout", &result.stdout), ("stderr", &*stderr)];
        let produced = |c: &Captured| !c.data.is_empty() || c.dropped > 0;
        if !streams.iter().any(|(_, c)| produced(c)) && result.outputs.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(&dir)?;
        for (name, captured) in streams {
            if produced(captured) {
                write_captured(&dir.join(name), captured)?;
            }
        }
        for output in &result.outputs {
            let Some(relative) = safe_relative(&output.path) else {
                warn!(job = %result.job, task = result.task, path = %output.path, "output path outside the task directory ignored");
                continue;
            };
            if let Err(e) = write_output(&dir, &relative, output) {
                // The disk is the problem: the result must wait. Otherwise
                // this one file is, and the rest of the result still counts.
                if matches!(
                    e.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                ) || e.raw_os_error() == Some(5)
                {
                    return Err(e);
                }
                warn!(job = %result.job, task = result.task, path = %output.path, error = %e, "output file not written");
            }
        }
        Ok(())
    }

    /// Appends final states to the index (not yet synced).
    pub fn append(&mut self, entries: &[IndexEntry]) -> io::Result<()> {
        let mut lines = Vec::with_capacity(entries.len() * 160);
        for entry in entries {
            serde_json::to_writer(&mut lines, entry)?;
            lines.push(b'\n');
        }
        self.index.write_all(&lines)
    }

    /// Makes everything written so far durable: one `syncfs` covers the
    /// index, every task file and the new directories at once.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::syncfs(&self.index).map_err(io::Error::from)
    }

    pub fn read_job_file(&self) -> Option<JobFile> {
        Self::job_file_at(&self.root, self.account.as_ref())
    }

    /// The `job.json` of the results directory at `root`, without opening
    /// the directory: its index belongs to whoever holds the job's lock.
    pub fn job_file_at(root: &Path, account: Option<&Account>) -> Option<JobFile> {
        let text = as_account(account, || {
            read_at_most(&root.join("job.json"), MAX_JOB_FILE)
        })
        .ok()?;
        match serde_json::from_slice(&text) {
            Ok(file) => Some(file),
            Err(e) => {
                warn!(results = %root.display(), error = %e, "unreadable job.json ignored");
                None
            }
        }
    }

    /// Appends an addition to `additions.jsonl`, durably.
    pub fn append_addition(&self, added: &AddedTasks) -> io::Result<()> {
        as_account(self.account.as_ref(), || {
            let mut line = serde_json::to_vec(added)?;
            line.push(b'\n');
            let path = self.root.join(ADDITIONS_FILE);
            let new = !path.exists();
            let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
            file.write_all(&line)?;
            file.sync_data()?;
            if new {
                // The file's name is durable only with its directory.
                File::open(&self.root)?.sync_all()?;
            }
            Ok(())
        })
    }

    /// The additions recorded so far, in order. A line cut short by a
    /// crash (its addition was not acked, and comes again) is cut off, so
    /// that the next addition starts a line of its own.
    pub fn read_additions(&self) -> io::Result<Vec<AddedTasks>> {
        as_account(self.account.as_ref(), || {
            let path = self.root.join(ADDITIONS_FILE);
            let mut text = match read_at_most(&path, MAX_ADDITIONS_FILE) {
                Ok(text) => text,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            if whole < text.len() {
                warn!(results = %self.root.display(), "additions.jsonl ends in a line cut short; cut off");
                OpenOptions::new()
                    .write(true)
                    .open(&path)?
                    .set_len(whole as u64)?;
                text.truncate(whole);
            }
            Ok(read_additions(&String::from_utf8_lossy(&text)))
        })
    }

    /// Replaces `job.json` atomically and durably.
    pub fn write_job_file(&self, file: &JobFile) -> io::Result<()> {
        as_account(self.account.as_ref(), || self.replace("job.json", file))
    }

    /// Keeps the manifest as it ran (`manifest.json`, a sweep's data files'
    /// rows in it), which `gleaner resubmit` reads back; and a rerun's
    /// link to the results of the job it reruns (`rerun-of`).
    pub fn keep_manifest(&self, manifest: &Manifest) -> io::Result<()> {
        as_account(self.account.as_ref(), || {
            if !self.root.join(MANIFEST_FILE).exists() {
                self.replace(MANIFEST_FILE, manifest)?;
            }
            let link = self.root.join("rerun-of");
            match manifest.rerun.as_ref().and_then(|r| r.results.as_ref()) {
                Some(original) if link.symlink_metadata().is_err() => {
                    std::os::unix::fs::symlink(original, link)
                }
                _ => Ok(()),
            }
        })
    }

    /// Replaces a file of the directory with `value` as JSON, atomically
    /// and durably.
    fn replace(&self, name: &str, value: &impl serde::Serialize) -> io::Result<()> {
        let tmp = self.root.join(format!("{name}.tmp"));
        let mut out = File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut out, value)?;
        out.write_all(b"\n")?;
        out.sync_all()?;
        std::fs::rename(&tmp, self.root.join(name))?;
        File::open(&self.root)?.sync_all()
    }
}

/// The largest `job.json` read: the runner writes a few kilobytes.
const MAX_JOB_FILE: u64 = 1 << 20;
/// The largest `additions.jsonl` read: far more than `MAX_TASKS` tasks of
/// additions take.
const MAX_ADDITIONS_FILE: u64 = 1 << 30;

/// A file of the owner's directory, read whole only if it is at most
/// `limit` bytes: the owner may have made it anything, a sparse file of
/// terabytes included.
fn read_at_most(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut text = Vec::new();
    regular(
        OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)?,
        path,
    )?
    .take(limit + 1)
    .read_to_end(&mut text)?;
    if text.len() as u64 > limit {
        return Err(io::Error::other(format!(
            "{} is larger than {limit} bytes",
            path.display()
        )));
    }
    Ok(text)
}

/// `file`, if it is a regular file: the owner may have put a pipe there,
/// which would keep the runner waiting (opened without waiting for a
/// writer, `O_NONBLOCK`), or a device.
fn regular(file: File, path: &Path) -> io::Result<File> {
    if file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )))
    }
}

/// A run's stderr, followed by why it could not start, if it could not: the
/// file a user is pointed to then says what went wrong.
fn stderr_of(result: &ResultMsg) -> std::borrow::Cow<'_, Captured> {
    match &result.error {
        None => std::borrow::Cow::Borrowed(&result.stderr),
        Some(error) => {
            let mut stderr = result.stderr.clone();
            stderr
                .data
                .extend_from_slice(format!("gleaner: {error}\n").as_bytes());
            std::borrow::Cow::Owned(stderr)
        }
    }
}

/// One declared output file; a truncated one gets a note beside it.
fn write_output(dir: &Path, relative: &Path, output: &OutputFile) -> io::Result<()> {
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, &output.data)?;
    if output.dropped > 0 {
        let mut note = path.into_os_string();
        note.push(".truncated");
        std::fs::write(
            note,
            format!(
                "gleaner kept the first {} bytes of this file; {} more were not collected\n",
                output.data.len(),
                output.dropped
            ),
        )?;
    }
    Ok(())
}

fn write_captured(path: &Path, captured: &Captured) -> io::Result<()> {
    if captured.dropped == 0 {
        return std::fs::write(path, &captured.data);
    }
    let mut file = File::create(path)?;
    writeln!(
        file,
        "[gleaner: the first {} bytes of this stream were dropped; the last {} follow]",
        captured.dropped,
        captured.data.len()
    )?;
    file.write_all(&captured.data)
}

/// A path from a launcher, accepted only if it stays inside the task directory
/// and does not replace the captured streams.
fn safe_relative(path: &str) -> Option<PathBuf> {
    let path = Path::new(path);
    let normal = path.components().all(|c| matches!(c, Component::Normal(_)));
    let reserved = matches!(path.to_str(), Some("stdout" | "stderr"));
    (normal && !reserved && path.components().next().is_some()).then(|| path.to_path_buf())
}

/// Reads the index back, and cuts off a line a crash left half-written so
/// that appending starts on a fresh line.
fn recover_index(index: &mut File, root: &Path) -> io::Result<Vec<(u64, FinalStatus)>> {
    index.rewind()?;
    let contents = read_index(BufReader::new(&*index))?;
    if let Some(error) = &contents.first_error {
        warn!(results = %root.display(), lines = contents.unreadable, first = %error, "unreadable index lines skipped");
    }
    let length = index.metadata()?.len();
    if length > contents.whole_bytes {
        warn!(
            results = %root.display(),
            bytes = length - contents.whole_bytes,
            "index ended in a partial line (a crash while writing); dropping it"
        );
        index.set_len(contents.whole_bytes)?;
    }
    Ok(contents.finished)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_protocol::{JobState, RunStatus, TaskCounts};
    use indexmap::IndexMap;

    fn entry(task: u64, status: FinalStatus) -> IndexEntry {
        IndexEntry {
            peak_memory_mb: None,
            task,
            command: format!("echo {task}"),
            params: IndexMap::new(),
            status,
            exit_code: Some(0),
            attempts: 1,
            preemptions: 0,
            runtime_s: 0.5,
            cluster: Some("local".into()),
            host: Some("h".into()),
            error: None,
        }
    }

    #[test]
    fn a_pipe_or_a_huge_file_in_the_owners_directory_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&dir.path().join("job.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(
            ResultsDir::job_file_at(dir.path(), None).is_none(),
            "no wait on a pipe"
        );
        let additions = dir.path().join(ADDITIONS_FILE);
        std::fs::File::create(&additions)
            .unwrap()
            .set_len(MAX_ADDITIONS_FILE + 1)
            .unwrap();
        assert!(read_at_most(&additions, MAX_ADDITIONS_FILE).is_err());
        nix::unistd::mkfifo(
            &dir.path().join("index.jsonl"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        assert!(ResultsDir::open(dir.path(), None).is_err());
    }

    #[test]
    fn index_survives_reopen_and_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let (mut results, finished) = ResultsDir::open(dir.path(), None).unwrap();
        assert!(finished.is_empty());
        results
            .append(&[
                entry(0, FinalStatus::Succeeded),
                entry(1, FinalStatus::Failed),
            ])
            .unwrap();
        results.sync().unwrap();
        drop(results);
        let index = dir.path().join("index.jsonl");
        let mut file = OpenOptions::new().append(true).open(&index).unwrap();
        // Cut in the middle of a two-byte character.
        file.write_all(
            "{\"task\":2,\"command\":\"é"
                .as_bytes()
                .split_last()
                .unwrap()
                .1,
        )
        .unwrap();
        drop(file);
        let (mut results, finished) = ResultsDir::open(dir.path(), None).unwrap();
        assert_eq!(
            finished,
            [(0, FinalStatus::Succeeded), (1, FinalStatus::Failed)]
        );
        results.append(&[entry(2, FinalStatus::Lost)]).unwrap();
        let text = std::fs::read_to_string(&index).unwrap();
        assert_eq!(text.lines().count(), 3);
        let line: serde_json::Value = serde_json::from_str(text.lines().nth(2).unwrap()).unwrap();
        assert_eq!(line["status"], "lost");
        assert_eq!(line["command"], "echo 2");
    }

    #[test]
    fn outputs_are_written_and_confined() {
        let dir = tempfile::tempdir().unwrap();
        let (results, _) = ResultsDir::open(dir.path(), None).unwrap();
        let result = ResultMsg {
            peak_memory_mb: None,
            job: "j-0000000000000000".parse().unwrap(),
            task: 7,
            attempt: 1,
            preemptions: 0,
            status: RunStatus::Succeeded,
            exit_code: Some(0),
            signal: None,
            runtime_ms: 5,
            launcher: "l".into(),
            cluster: "c".into(),
            host: "h".into(),
            stdout: Captured {
                data: b"tail\n".to_vec(),
                dropped: 100,
            },
            stderr: Captured {
                data: b"err\n".to_vec(),
                dropped: 0,
            },
            outputs: vec![
                OutputFile {
                    path: "plots/a.png".into(),
                    data: b"png".to_vec(),
                    dropped: 7,
                },
                OutputFile {
                    path: "../escape".into(),
                    data: b"x".to_vec(),
                    dropped: 0,
                },
                OutputFile {
                    path: "stdout".into(),
                    data: b"x".to_vec(),
                    dropped: 0,
                },
            ],
            error: None,
        };
        results.write_outputs(&result, false).unwrap();
        let task = dir.path().join("tasks/7");
        let stdout = std::fs::read_to_string(task.join("stdout")).unwrap();
        assert!(
            stdout.starts_with("[gleaner: the first 100 bytes"),
            "{stdout}"
        );
        assert!(stdout.ends_with("tail\n"));
        assert_eq!(std::fs::read(task.join("stderr")).unwrap(), b"err\n");
        assert_eq!(std::fs::read(task.join("plots/a.png")).unwrap(), b"png");
        assert!(
            task.join("plots/a.png.truncated").exists(),
            "truncation is marked"
        );
        assert!(!dir.path().join("tasks/escape").exists());

        let silent = ResultMsg {
            peak_memory_mb: None,
            task: 8,
            stdout: Captured::default(),
            stderr: Captured::default(),
            outputs: vec![],
            ..result
        };
        results.write_outputs(&silent, false).unwrap();
        assert!(
            !dir.path().join("tasks/8").exists(),
            "no output, no directory"
        );
    }

    #[test]
    fn an_addition_cut_short_is_cut_off_and_the_next_starts_its_own_line() {
        let dir = tempfile::tempdir().unwrap();
        let (results, _) = ResultsDir::open(dir.path(), None).unwrap();
        let added = |id, first| AddedTasks {
            first,
            addition: gleaner_manifest::Addition {
                id,
                tasks: vec![gleaner_manifest::TaskDef {
                    command: "true".into(),
                }],
                sweep: None,
            },
        };
        results.append_addition(&added(1, 0)).unwrap();
        let path = dir.path().join(ADDITIONS_FILE);
        let mut text = std::fs::read(&path).unwrap();
        let whole = text.len();
        text.extend_from_slice(b"{\"first\":1,\"addi");
        std::fs::write(&path, &text).unwrap();
        let read = results.read_additions().unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole as u64);
        results.append_addition(&added(2, 1)).unwrap();
        let read = results.read_additions().unwrap();
        assert_eq!(
            read.iter().map(|a| a.addition.id).collect::<Vec<_>>(),
            [1, 2]
        );
    }

    #[test]
    fn job_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let (results, _) = ResultsDir::open(dir.path(), None).unwrap();
        assert!(results.read_job_file().is_none());
        let file = JobFile {
            job: "j-0000000000000000".into(),
            owner: "alice".into(),
            name: "j".into(),
            state: JobState::Running,
            runner: "runner@h".into(),
            results: dir.path().display().to_string(),
            submitted_at: 1,
            started_at: 2,
            finished_at: None,
            makespan_s: None,
            tasks: TaskCounts::default(),
            duplicates: 0,
            preemptions: 0,
            tasks_published: true,
            components: vec![Some("c1".into()), None],
            restarts: 1,
            final_published: false,
            final_step: None,
            closed: false,
            additions_published: 0,
            gathering: Some(crate::records::Gather {
                figures: gleaner_protocol::Gathering {
                    at_barrier: 1,
                    claiming_tries: 2,
                    placement_s: Some(0.5),
                    barrier_s: None,
                    start_delay_s: None,
                    ..Default::default()
                },
                level: 0.625,
                waiting_since: 1,
                run: Some(crate::records::Claim {
                    placed_at: 3,
                    start_by: 600_003,
                    next_try: 450_003,
                    started: [(
                        0,
                        crate::records::StartedComponent {
                            cluster: "c1".into(),
                            hosts: vec![gleaner_protocol::HostSlots {
                                host: "n1".into(),
                                slots: 4,
                            }],
                            at: 4,
                        },
                    )]
                    .into(),
                    released_at: None,
                    stopping: Some(5),
                    stopped: [0].into(),
                    avoid: Default::default(),
                    moving: Default::default(),
                    slots: Default::default(),
                }),
            }),
        };
        results.write_job_file(&file).unwrap();
        assert_eq!(results.read_job_file(), Some(file));
    }
}
