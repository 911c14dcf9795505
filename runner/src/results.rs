//! The results directory of a job: `index.jsonl`, `output.log` (every
//! run's stdout and stderr, appended; the index says where each task's
//! are), `attempts.jsonl` (runs that were retried), `tasks/<task>/…` (the
//! files a task declared as `outputs`), `job.json`.
//!
//! Everything is on disk (and synced) before the messages it came from are
//! acked, and the directory alone is enough to resume a job after a crash.
//! A job makes a handful of files, not a few per task: a shared file
//! system's admins count inodes.

use std::{
    collections::HashMap,
    fs::{File, OpenOptions},
    io::{self, BufReader, Read, Seek, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Component, Path, PathBuf},
};

use gleaner_manifest::Manifest;
use gleaner_protocol::{
    Captured, MAX_PARTED_BYTES, MAX_PARTED_TARGETS, OutputFile, ResultMsg, ResultPart,
};
use tracing::warn;

use gleaner_runner_core::{
    FinalStatus,
    records::{
        AddedTasks, AttemptEntry, IndexEntry, JobFile, MAX_JOB_FILE, Span, Streams, read_additions,
        read_index,
    },
};

use crate::owner::{Account, as_account};

/// The manifest a job ran, in its results directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Tasks added to an open job, one addition per line.
const ADDITIONS_FILE: &str = "additions.jsonl";
/// Every run's stdout and stderr, one after the other.
pub const OUTPUT_FILE: &str = "output.log";
/// Runs that failed and were retried, one per line.
pub const ATTEMPTS_FILE: &str = "attempts.jsonl";
/// Where the parts of runs wait for their results.
const PARTS_DIR: &str = ".parts";

/// The most of a parted run's stream read back into memory: a stream is
/// a tail the launcher bounds (`max_stream_bytes`, a MiB by default).
const MAX_STAGED_STREAM: u64 = 16 << 20;

/// Where a parted run's output files wait under `.parts/`, and how many
/// bytes each target should have (stdout, stderr, then the files).
#[derive(Debug)]
pub struct StagedFiles {
    dir: PathBuf,
    sizes: Vec<u64>,
}

impl StagedFiles {
    /// Output file `index`'s staged file, if the run was parted.
    fn file(&self, index: usize) -> Option<PathBuf> {
        (index + 2 < self.sizes.len().min(MAX_PARTED_TARGETS))
            .then(|| self.dir.join((index + 2).to_string()))
    }
}

pub struct ResultsDir {
    root: PathBuf,
    index: File,
    output: File,
    attempts: File,
    /// Where the streams of tasks' last runs went, until their index lines
    /// are written.
    streams: HashMap<u64, Streams>,
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
            let mut index = open_appending(&root.join("index.jsonl"))?;
            let finished = recover_index(&mut index, root)?;
            Ok((
                Self {
                    root: root.to_path_buf(),
                    index,
                    output: open_appending(&root.join(OUTPUT_FILE))?,
                    attempts: open_appending(&root.join(ATTEMPTS_FILE))?,
                    streams: HashMap::new(),
                    account: account.cloned(),
                },
                finished,
            ))
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes a task's run: its streams to `output.log` (its next index
    /// line says where), its declared output files under `tasks/<task>/`,
    /// replacing what an earlier attempt left. The final step's streams and
    /// files go under `final/`, as files.
    pub fn write_outputs(
        &mut self,
        result: &ResultMsg,
        final_step: bool,
        staged: Option<&StagedFiles>,
    ) -> io::Result<()> {
        if final_step {
            let dir = self.root.join("final");
            return as_account(self.account.as_ref(), || {
                write_final_outputs(result, &dir, staged)
            });
        }
        let streams = self.append_streams(result)?;
        self.streams.insert(result.task, streams);
        let dir = self.root.join("tasks").join(result.task.to_string());
        as_account(self.account.as_ref(), || {
            remove_dir(&dir)?;
            write_output_files(result, &dir, staged)
        })
    }

    /// Writes a failed run that is retried: its streams to `output.log`,
    /// a line saying where to `attempts.jsonl` (made durable with the
    /// next index lines).
    pub fn write_retried(&mut self, result: &ResultMsg) -> io::Result<()> {
        let streams = self.append_streams(result)?;
        let entry = AttemptEntry {
            task: result.task,
            attempt: result.attempt,
            exit_code: result.exit_code,
            error: result.error.clone(),
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        let mut line = serde_json::to_vec(&entry)?;
        line.push(b'\n');
        self.attempts.write_all(&line)
    }

    /// Appends a run's stdout and stderr (a stream cut short starts with a
    /// line saying so) to `output.log`.
    fn append_streams(&mut self, result: &ResultMsg) -> io::Result<Streams> {
        let stderr = stderr_of(result);
        let mut append = |captured: &Captured| -> io::Result<Option<Span>> {
            if captured.data.is_empty() && captured.dropped == 0 {
                return Ok(None);
            }
            let offset = self.output.metadata()?.len();
            let note = match captured.dropped {
                0 => String::new(),
                dropped => dropped_note(dropped, captured.data.len()),
            };
            self.output.write_all(note.as_bytes())?;
            self.output.write_all(&captured.data)?;
            Ok(Some(Span {
                offset,
                bytes: (note.len() + captured.data.len()) as u64,
            }))
        };
        Ok(Streams {
            stdout: append(&result.stdout)?,
            stderr: append(&stderr)?,
        })
    }

    /// Where the parts of `task`'s run `run` wait.
    fn parts_of(&self, task: u64, run: u64) -> PathBuf {
        self.root.join(PARTS_DIR).join(format!("{task}.{run:016x}"))
    }

    /// Writes a part of a run's output where its result will find it (made
    /// durable with the next sync). A part no launcher would send (a
    /// target or an offset out of bounds) is refused.
    pub fn stage_part(&self, part: &ResultPart) -> io::Result<()> {
        let end = part.offset.saturating_add(part.data.len() as u64);
        if part.target as usize >= MAX_PARTED_TARGETS || end > MAX_PARTED_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a part of task {} for target {} up to byte {end}: out of bounds",
                    part.task, part.target
                ),
            ));
        }
        let dir = self.parts_of(part.task, part.run);
        as_account(self.account.as_ref(), || {
            std::fs::create_dir_all(&dir)?;
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                .open(dir.join(part.target.to_string()))?;
            use std::os::unix::fs::FileExt;
            regular(file, &dir)?.write_all_at(&part.data, part.offset)
        })
    }

    /// Puts a parted run's streams back into its result from its parts
    /// (the last [`MAX_STAGED_STREAM`] bytes of each at most, the rest
    /// counted as dropped), and gives where its output files wait: they
    /// are linked into place, never read, and the parts stay until
    /// [`ResultsDir::remove_parts`]. Bytes that never came are
    /// missing, with a warning: the result still counts.
    pub fn unpart(&self, result: &mut ResultMsg) -> Option<StagedFiles> {
        let parted = result.parted.take()?;
        let task = result.task;
        let dir = self.parts_of(task, parted.run);
        for (target, captured) in [&mut result.stdout, &mut result.stderr]
            .into_iter()
            .enumerate()
        {
            let size = parted.sizes.get(target).copied().unwrap_or(0);
            let path = dir.join(target.to_string());
            let read = as_account(self.account.as_ref(), || {
                read_tail(&path, MAX_STAGED_STREAM)
            });
            captured.data = match read {
                Ok((data, skipped)) => {
                    captured.dropped = captured.dropped.saturating_add(skipped);
                    data
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    warn!(task, path = %path.display(), error = %e, "a part of a run's output cannot be read");
                    Vec::new()
                }
            };
            let came = captured.data.len() as u64;
            if came < size.min(MAX_STAGED_STREAM) {
                warn!(
                    task,
                    target,
                    missing = size - came,
                    "part of a run's output never came"
                );
            }
        }
        Some(StagedFiles {
            dir,
            sizes: parted.sizes,
        })
    }

    /// Removes a parted run's parts once its result is written and acked.
    pub fn remove_parts(&self, staged: StagedFiles) {
        if let Err(e) = as_account(self.account.as_ref(), || remove_dir(&staged.dir)) {
            warn!(dir = %staged.dir.display(), error = %e, "a run's parts are left behind");
        }
    }

    /// Removes the parts of runs whose results never came (a launcher
    /// that died between, a run that ran twice): for a job that ended.
    pub fn clear_parts(&self) -> io::Result<()> {
        as_account(self.account.as_ref(), || {
            remove_dir(&self.root.join(PARTS_DIR))
        })
    }

    /// Appends final states to the index (not yet synced), each with
    /// where its last run's streams went.
    pub fn append(&mut self, entries: Vec<IndexEntry>) -> io::Result<()> {
        let mut lines = Vec::with_capacity(entries.len() * 160);
        for mut entry in entries {
            if let Some(streams) = self.streams.remove(&entry.task) {
                entry.stdout = streams.stdout;
                entry.stderr = streams.stderr;
            }
            serde_json::to_writer(&mut lines, &entry)?;
            lines.push(b'\n');
        }
        self.index.write_all(&lines)
    }

    /// Makes everything written so far durable: one `syncfs` covers the
    /// index, the output log, every task file and the new directories at
    /// once.
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

/// The last `limit` bytes at most of a regular file of the owner's
/// directory (not following a link), and how many before them were skipped.
fn read_tail(path: &Path, limit: u64) -> io::Result<(Vec<u8>, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    let mut file = regular(file, path)?;
    let skipped = file.metadata()?.len().saturating_sub(limit);
    file.seek(io::SeekFrom::Start(skipped))?;
    let mut data = Vec::new();
    file.take(limit).read_to_end(&mut data)?;
    Ok((data, skipped))
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

/// Opens a file of the directory to append to; it must be a regular file
/// (the owner may have put a pipe there, which would keep the runner
/// waiting, `O_NONBLOCK`, or a device).
fn open_appending(path: &Path) -> io::Result<File> {
    let opened = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    regular(opened, path)
}

/// The line that starts a stream whose beginning was dropped.
fn dropped_note(dropped: u64, kept: usize) -> String {
    format!(
        "[gleaner: the first {dropped} bytes of this stream were dropped; the last {kept} follow]\n"
    )
}

/// The final step's run under `dir` (`final/`), streams and files,
/// replacing what an earlier attempt left.
fn write_final_outputs(
    result: &ResultMsg,
    dir: &Path,
    staged: Option<&StagedFiles>,
) -> io::Result<()> {
    remove_dir(dir)?;
    let stderr = stderr_of(result);
    for (name, captured) in [("stdout", &result.stdout), ("stderr", &*stderr)] {
        if captured.data.is_empty() && captured.dropped == 0 {
            continue;
        }
        std::fs::create_dir_all(dir)?;
        let mut file = File::create(dir.join(name))?;
        if captured.dropped > 0 {
            file.write_all(dropped_note(captured.dropped, captured.data.len()).as_bytes())?;
        }
        file.write_all(&captured.data)?;
    }
    write_output_files(result, dir, staged)
}

/// `dir` and what is in it, if it is there.
fn remove_dir(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A run's declared output files under `dir`. A run that declared none
/// makes no directory.
fn write_output_files(
    result: &ResultMsg,
    dir: &Path,
    staged: Option<&StagedFiles>,
) -> io::Result<()> {
    for (index, output) in result.outputs.iter().enumerate() {
        let Some(relative) = safe_relative(&output.path) else {
            warn!(job = %result.job, task = result.task, path = %output.path, "output path outside the task directory ignored");
            continue;
        };
        let parted = staged.and_then(|s| s.file(index));
        if let Err(e) = write_output(dir, &relative, output, parted) {
            // The disk is the problem: the result must wait. Otherwise
            // this one file is, and the rest of the result still counts.
            if is_disk_failure(&e) {
                return Err(e);
            }
            warn!(job = %result.job, task = result.task, path = %output.path, error = %e, "output file not written");
        }
    }
    Ok(())
}

/// An error of the disk (full, over quota, failing) rather than of one
/// file: writing anything else would fail too.
pub fn is_disk_failure(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || e.raw_os_error() == Some(nix::libc::EIO)
}

/// One declared output file, from its message or moved from where its
/// parts were staged; a truncated one gets a note beside it.
fn write_output(
    dir: &Path,
    relative: &Path,
    output: &OutputFile,
    staged: Option<PathBuf>,
) -> io::Result<()> {
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let kept = match staged {
        None => {
            std::fs::write(&path, &output.data)?;
            output.data.len() as u64
        }
        // A link, not a move: the parts stay until the result is acked,
        // for a result delivered again after a failure to find.
        Some(from) => match std::fs::hard_link(&from, &path) {
            Ok(()) => std::fs::symlink_metadata(&path)?.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::write(&path, b"")?;
                0
            }
            Err(_) => copy_staged(&from, &path)?,
        },
    };
    if output.dropped > 0 {
        let mut note = path.into_os_string();
        note.push(".truncated");
        std::fs::write(
            note,
            format!(
                "gleaner kept the first {kept} bytes of this file; {} more were not collected\n",
                output.dropped
            ),
        )?;
    }
    Ok(())
}

/// A staged output file copied into place where it cannot be linked (a
/// file system without hard links), a regular file only.
fn copy_staged(from: &Path, to: &Path) -> io::Result<u64> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(from)?;
    io::copy(&mut regular(file, from)?, &mut File::create(to)?)
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
            stdout: None,
            stderr: None,
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
        for file in [OUTPUT_FILE, ATTEMPTS_FILE] {
            let dir = tempfile::tempdir().unwrap();
            nix::unistd::mkfifo(&dir.path().join(file), nix::sys::stat::Mode::S_IRWXU).unwrap();
            assert!(
                ResultsDir::open(dir.path(), None).is_err(),
                "a pipe as {file}"
            );
        }
    }

    #[test]
    fn index_survives_reopen_and_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let (mut results, finished) = ResultsDir::open(dir.path(), None).unwrap();
        assert!(finished.is_empty());
        results
            .append(vec![
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
        results.append(vec![entry(2, FinalStatus::Lost)]).unwrap();
        let text = std::fs::read_to_string(&index).unwrap();
        assert_eq!(text.lines().count(), 3);
        let line: serde_json::Value = serde_json::from_str(text.lines().nth(2).unwrap()).unwrap();
        assert_eq!(line["status"], "lost");
        assert_eq!(line["command"], "echo 2");
    }

    /// A task's run with this stdout, stderr and declared files.
    fn run(task: u64, stdout: Captured, stderr: &[u8], outputs: Vec<OutputFile>) -> ResultMsg {
        ResultMsg {
            peak_memory_mb: None,
            job: "j-0000000000000000".parse().unwrap(),
            task,
            attempt: 1,
            preemptions: 0,
            status: RunStatus::Succeeded,
            exit_code: Some(0),
            signal: None,
            runtime_ms: 5,
            launcher: "l".into(),
            cluster: "c".into(),
            host: "h".into(),
            stdout,
            stderr: Captured {
                data: stderr.to_vec(),
                dropped: 0,
            },
            outputs,
            error: None,
            parted: None,
        }
    }

    /// The index line of `task`, and its streams read from `output.log`.
    fn streams_of(root: &Path, task: u64) -> (serde_json::Value, String, String) {
        let index = std::fs::read_to_string(root.join("index.jsonl")).unwrap();
        let line: serde_json::Value = index
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|l| l["task"] == task)
            .unwrap();
        let log = std::fs::read(root.join(OUTPUT_FILE)).unwrap();
        let read = |span: &serde_json::Value| {
            let (offset, bytes) = (span["offset"].as_u64(), span["bytes"].as_u64());
            match (offset, bytes) {
                (Some(o), Some(b)) => {
                    String::from_utf8_lossy(&log[o as usize..(o + b) as usize]).into_owned()
                }
                _ => String::new(),
            }
        };
        let (stdout, stderr) = (read(&line["stdout"]), read(&line["stderr"]));
        (line, stdout, stderr)
    }

    #[test]
    fn streams_go_to_one_log_and_declared_files_are_confined() {
        let dir = tempfile::tempdir().unwrap();
        let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
        let result = run(
            7,
            Captured {
                data: b"tail\n".to_vec(),
                dropped: 100,
            },
            b"err\n",
            vec![
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
        );
        results.write_outputs(&result, false, None).unwrap();
        results
            .append(vec![entry(7, FinalStatus::Succeeded)])
            .unwrap();
        let (_, stdout, stderr) = streams_of(dir.path(), 7);
        assert!(
            stdout.starts_with("[gleaner: the first 100 bytes"),
            "{stdout}"
        );
        assert!(stdout.ends_with("tail\n"));
        assert_eq!(stderr, "err\n");
        let task = dir.path().join("tasks/7");
        assert!(!task.join("stdout").exists(), "streams are not files");
        assert_eq!(std::fs::read(task.join("plots/a.png")).unwrap(), b"png");
        assert!(
            task.join("plots/a.png.truncated").exists(),
            "truncation is marked"
        );
        assert!(!dir.path().join("tasks/escape").exists());

        let silent = run(8, Captured::default(), b"", vec![]);
        results.write_outputs(&silent, false, None).unwrap();
        results
            .append(vec![entry(8, FinalStatus::Succeeded)])
            .unwrap();
        assert!(
            !dir.path().join("tasks/8").exists(),
            "no output, no directory"
        );
        let (line, _, _) = streams_of(dir.path(), 8);
        assert!(line.get("stdout").is_none(), "{line}");
    }

    #[test]
    fn a_parted_runs_streams_come_back_and_its_files_are_moved_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
        let file = OutputFile {
            path: "out.bin".into(),
            data: vec![7; 3000],
            dropped: 0,
        };
        let whole = run(
            4,
            Captured {
                data: b"printed\n".to_vec(),
                dropped: 0,
            },
            b"",
            vec![file],
        );
        let (parts, mut stripped) = whole.clone().into_parts(9);
        assert!(parts.is_empty(), "small enough to go whole");
        // As a launcher would send it with more output: in parts.
        stripped.parted = Some(gleaner_protocol::Parted {
            run: 9,
            sizes: vec![8, 0, 3000],
        });
        stripped.stdout.data.clear();
        stripped.outputs[0].data.clear();
        let part = |target, offset: usize, data: &[u8]| ResultPart {
            job: stripped.job.clone(),
            task: 4,
            run: 9,
            target,
            offset: offset as u64,
            data: data.to_vec(),
        };
        for part in [
            part(2, 1000, &whole.outputs[0].data[1000..]),
            part(0, 0, b"printed\n"),
            part(2, 0, &whole.outputs[0].data[..1000]),
            part(2, 0, &whole.outputs[0].data[..1000]),
        ] {
            results.stage_part(&part).unwrap();
        }
        let far = ResultPart {
            target: 5000,
            ..part(2, 0, b"x")
        };
        assert!(results.stage_part(&far).is_err(), "no launcher sends that");
        // Written once, and again as after a failure before the ack: the
        // parts are still there for the second time.
        let parted = stripped.clone();
        for _ in 0..2 {
            stripped = parted.clone();
            let staged = results.unpart(&mut stripped);
            results
                .write_outputs(&stripped, false, staged.as_ref())
                .unwrap();
            assert!(dir.path().join(".parts/4.0000000000000009/2").exists());
        }
        let staged = results.unpart(&mut parted.clone()).unwrap();
        results.remove_parts(staged);
        results
            .append(vec![entry(4, FinalStatus::Succeeded)])
            .unwrap();
        let (_, stdout, _) = streams_of(dir.path(), 4);
        assert_eq!(stdout, "printed\n");
        assert_eq!(
            std::fs::read(dir.path().join("tasks/4/out.bin")).unwrap(),
            whole.outputs[0].data
        );
        assert!(!dir.path().join(".parts/4.0000000000000009").exists());
    }

    #[test]
    fn a_thousand_tasks_that_print_make_no_file_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
        let files = || walk(dir.path());
        let before = files();
        for task in 0..1000 {
            let printed = Captured {
                data: format!("task {task}\n").into_bytes(),
                dropped: 0,
            };
            results
                .write_outputs(&run(task, printed, b"warn\n", vec![]), false, None)
                .unwrap();
            results
                .append(vec![entry(task, FinalStatus::Succeeded)])
                .unwrap();
        }
        results.sync().unwrap();
        assert_eq!(files(), before);
        let (_, stdout, stderr) = streams_of(dir.path(), 999);
        assert_eq!((stdout.as_str(), stderr.as_str()), ("task 999\n", "warn\n"));
    }

    #[test]
    fn a_retried_run_is_in_the_log_and_in_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let (mut results, _) = ResultsDir::open(dir.path(), None).unwrap();
        let mut failed = run(3, Captured::default(), b"boom\n", vec![]);
        failed.exit_code = Some(2);
        results.write_retried(&failed).unwrap();
        let line = std::fs::read_to_string(dir.path().join(ATTEMPTS_FILE)).unwrap();
        let attempt: AttemptEntry = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(
            (attempt.task, attempt.attempt, attempt.exit_code),
            (3, 1, Some(2))
        );
        assert!(attempt.stdout.is_none());
        let span = attempt.stderr.unwrap();
        let log = std::fs::read(dir.path().join(OUTPUT_FILE)).unwrap();
        assert_eq!(
            &log[span.offset as usize..][..span.bytes as usize],
            b"boom\n"
        );
    }

    /// Every file and directory under `root`.
    fn walk(root: &Path) -> usize {
        std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .map(|e| {
                1 + if e.path().is_dir() {
                    walk(&e.path())
                } else {
                    0
                }
            })
            .sum()
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
            largest_bundle: 0,
            components: vec![Some("c1".into()), None],
            restarts: 1,
            final_published: false,
            final_step: None,
            closed: false,
            additions_published: 0,
            problem: None,
            gathering: Some(gleaner_runner_core::records::Gather {
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
                run: Some(gleaner_runner_core::records::Claim {
                    placed_at: 3,
                    start_by: 600_003,
                    next_try: 450_003,
                    started: [(
                        0,
                        gleaner_runner_core::records::StartedComponent {
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
