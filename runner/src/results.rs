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
mod tests;
