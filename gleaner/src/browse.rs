//! `gleaner results` and `gleaner logs`: a job's results directory, read
//! where this host sees it (the runner's results root is usually shared).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gleaner_manifest::{JobId, JobIdError};
use serde_json::Value;

use crate::{client, error::CliError, output::Output, settings::Settings};

/// Where job `job`'s results are: `dir` if given; the running job's own
/// directory, as the scheduler knows it; or where the runner puts a job by
/// default (`results_root[/<account>]/results/<job>`).
pub async fn locate(
    settings: &Settings,
    job: &str,
    dir: Option<&Path>,
) -> Result<PathBuf, CliError> {
    let _: JobId = job
        .parse()
        .map_err(|e: JobIdError| CliError::BadInput(e.to_string()))?;
    if let Some(dir) = dir {
        return Ok(dir.to_owned());
    }
    if let Ok(Some(running)) = client::results_of(settings, job).await {
        return Ok(PathBuf::from(running));
    }
    let mut root = settings.runner.job.results_root.clone();
    if !settings.users.is_single() {
        let user = settings.broker_user();
        root.push(settings.users.account(&user));
    }
    Ok(root.join("results").join(job))
}

/// The index's lines, in the order recorded.
fn index(dir: &Path) -> Result<Vec<Value>, CliError> {
    let path = dir.join("index.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        CliError::Unsuccessful(Some(format!(
            "no results index at {} ({e}); `--dir` says where the job's results are",
            path.display()
        )))
    })?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// `gleaner results JOB [--status S]…`: the index, filtered.
pub async fn results(
    settings: &Settings,
    job: &str,
    statuses: &[String],
    dir: Option<&Path>,
    output: &dyn Output,
) -> Result<(), CliError> {
    let dir = locate(settings, job, dir).await?;
    let mut entries = index(&dir)?;
    let wanted: Vec<String> = statuses.iter().map(|s| s.replace('-', "_")).collect();
    entries.retain(|e| {
        wanted.is_empty()
            || wanted
                .iter()
                .any(|w| e["status"].as_str() == Some(w.as_str()))
    });
    entries.sort_by_key(|e| e["task"].as_u64());
    output.results(&dir, &entries);
    Ok(())
}

/// `gleaner logs JOB TASK`: a task's captured stdout (or stderr). Output
/// arrives when the task ends; `follow` waits for it.
pub async fn logs(
    settings: &Settings,
    job: &str,
    task: u64,
    stderr: bool,
    follow: bool,
    dir: Option<&Path>,
) -> Result<(), CliError> {
    let dir = locate(settings, job, dir).await?;
    let stream = if stderr { "stderr" } else { "stdout" };
    let path = dir.join("tasks").join(task.to_string()).join(stream);
    loop {
        match std::fs::read(&path) {
            Ok(data) => {
                use std::io::Write;
                let _ = std::io::stdout().write_all(&data);
                return Ok(());
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(CliError::Unsuccessful(Some(format!(
                    "cannot read {}: {e}",
                    path.display()
                ))));
            }
            Err(_) => {}
        }
        // No file: the task ended without writing to it, or has not ended.
        let ended = index(&dir)
            .map(|entries| entries.iter().any(|e| e["task"].as_u64() == Some(task)))
            .unwrap_or(false);
        if ended {
            return Ok(());
        }
        if !follow {
            return Err(CliError::Unsuccessful(Some(format!(
                "task {task} of {job} has not ended, or is not one of its tasks (output arrives when a task ends; --follow waits for it)"
            ))));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
