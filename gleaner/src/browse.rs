//! `gleaner results` and `gleaner logs`: a job's results directory, read
//! where this host sees it (the runner's results root is usually shared).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gleaner_manifest::{JobId, JobIdError, Manifest, Rerun, TaskList, TaskSet};
use serde_json::Value;

use crate::{client, error::CliError, output::Output, settings::Settings};

/// Where job `job`'s results are: `dir` if given; the job's own directory,
/// as the scheduler knows it (running or ended); or where the runner puts a
/// job by default (`results_root[/<account>]/results/<job>`).
pub async fn locate(
    settings: &Settings,
    job: &str,
    dir: Option<&Path>,
) -> Result<PathBuf, CliError> {
    let id: JobId = job
        .parse()
        .map_err(|e: JobIdError| CliError::BadInput(e.to_string()))?;
    if let Some(dir) = dir {
        return Ok(dir.to_owned());
    }
    if let Ok(Some(known)) = client::results_of(settings, &id).await {
        return Ok(PathBuf::from(known));
    }
    // No scheduler knows it (none runs, or the job ended long ago): where
    // the runner puts a job by default, in the layout this configuration
    // says, else in the other (a CLI is not told that `gleaner up` keeps
    // one user, say).
    let root = &settings.runner.job.results_root;
    let user = settings.broker_user();
    let relative = Manifest::default_results_dir(job);
    let configured = settings.users.results_area(root, &user).join(&relative);
    let other = gleaner_policy::access::results_area(
        root,
        settings
            .users
            .is_single()
            .then(|| settings.users.account(&user)),
    )
    .join(&relative);
    Ok(match configured.exists() || !other.exists() {
        true => configured,
        false => other,
    })
}

/// A file of a job's results directory; `what` it is, for the error.
fn read_results_file(dir: &Path, name: &str, what: &str) -> Result<Vec<u8>, CliError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| {
        CliError::Unsuccessful(Some(format!(
            "cannot read {what}, {} ({e}); `--dir` says where the job's results are",
            path.display()
        )))
    })
}

/// The index's lines, in the order recorded.
fn index(dir: &Path) -> Result<Vec<Value>, CliError> {
    let text = read_results_file(dir, "index.jsonl", "the results index")?;
    Ok(String::from_utf8_lossy(&text)
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

/// Which of a job's tasks `gleaner resubmit` runs again: those that ended
/// in one of `statuses` (any, when none is given), among `tasks` (all of
/// the job's, when not given).
#[derive(Debug, Default)]
pub struct RerunChoice {
    pub statuses: Vec<&'static str>,
    pub tasks: Option<TaskSet>,
}

/// The manifest of a rerun of `job`: its own manifest, as it ran, with
/// only the chosen tasks, and its results linked to the job's.
pub async fn rerun_manifest(
    settings: &Settings,
    job: &str,
    choice: &RerunChoice,
    dir: Option<&Path>,
) -> Result<Manifest, CliError> {
    let dir = locate(settings, job, dir).await?;
    let text = read_results_file(&dir, "manifest.json", &format!("the manifest {job} ran"))?;
    let mut manifest = Manifest::from_json(&text)
        .map_err(|e| CliError::BadInput(format!("{}: {e}", dir.join("manifest.json").display())))?;
    let ended: Vec<(u64, String)> = index(&dir)?
        .iter()
        .filter_map(|e| Some((e["task"].as_u64()?, e["status"].as_str()?.to_owned())))
        .collect();
    let chosen = choose(&manifest, job, &ended, choice)?;
    if manifest.open && !choice.statuses.is_empty() {
        let own = TaskList::new(&manifest).map_or(0, |tasks| tasks.len());
        if ended
            .iter()
            .any(|&(task, ref status)| task >= own && choice.statuses.contains(&status.as_str()))
        {
            eprintln!(
                "note: tasks added to {job} while it was open are not run again; only its manifest's are"
            );
        }
    }
    let results = std::path::absolute(&dir).unwrap_or(dir);
    manifest.rerun = Some(Rerun {
        of: job.to_owned(),
        tasks: chosen,
        results: Some(results.display().to_string()),
    });
    manifest.results = None;
    manifest.open = false;
    manifest
        .validate()
        .map_err(|e| CliError::BadInput(format!("the rerun of {job} is not a valid job: {e}")))?;
    Ok(manifest)
}

/// The tasks a rerun runs: `choice` applied to the job's tasks and how
/// those that ended (`ended`: number, status) ended.
fn choose(
    manifest: &Manifest,
    job: &str,
    ended: &[(u64, String)],
    choice: &RerunChoice,
) -> Result<TaskSet, CliError> {
    let all: TaskSet = match &manifest.rerun {
        Some(rerun) => rerun.tasks.clone(),
        None => {
            let count = TaskList::new(manifest)
                .map_err(|e| CliError::BadInput(e.to_string()))?
                .len();
            (0..count).collect()
        }
    };
    let mut candidates = all.clone();
    if let Some(asked) = &choice.tasks {
        if let Some(stranger) = asked.iter().find(|&t| !all.contains(t)) {
            return Err(CliError::BadInput(format!(
                "task {stranger} is not one of {job}'s tasks ({all})"
            )));
        }
        candidates = asked.clone();
    }
    if !choice.statuses.is_empty() {
        let matching: TaskSet = ended
            .iter()
            .filter(|(_, status)| choice.statuses.contains(&status.as_str()))
            .map(|&(task, _)| task)
            .collect();
        candidates = candidates.intersection(&matching);
    }
    if candidates.is_empty() {
        let which = choice.statuses.join(" or ").replace('_', "-");
        return Err(CliError::Unsuccessful(Some(format!(
            "no task of {job} ended {which}: nothing to run again"
        ))));
    }
    Ok(candidates)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(tasks: u64) -> Manifest {
        Manifest::from_toml(&format!(
            "name = \"s\"\n[sweep]\ncommand = \"echo {{i}}\"\nparams.i = {{ from = 0, to = {} }}\n",
            tasks - 1
        ))
        .unwrap()
    }

    fn ended() -> Vec<(u64, String)> {
        [
            (0, "succeeded"),
            (1, "failed"),
            (2, "timed_out"),
            (4, "failed"),
        ]
        .into_iter()
        .map(|(t, s)| (t, s.to_owned()))
        .collect()
    }

    #[test]
    fn a_rerun_takes_the_tasks_that_ended_so_among_those_asked() {
        let m = sweep(6);
        let failed = RerunChoice {
            statuses: vec!["failed"],
            tasks: None,
        };
        assert_eq!(
            choose(&m, "s-1", &ended(), &failed).unwrap().to_string(),
            "1,4"
        );
        let some = RerunChoice {
            statuses: vec!["failed", "timed_out"],
            tasks: Some("2-5".parse().unwrap()),
        };
        assert_eq!(
            choose(&m, "s-1", &ended(), &some).unwrap().to_string(),
            "2,4"
        );
        let asked = RerunChoice {
            statuses: vec![],
            tasks: Some("3,5".parse().unwrap()),
        };
        assert_eq!(
            choose(&m, "s-1", &ended(), &asked).unwrap().to_string(),
            "3,5"
        );
        let everything = RerunChoice::default();
        assert_eq!(
            choose(&m, "s-1", &ended(), &everything)
                .unwrap()
                .to_string(),
            "0-5"
        );
    }

    #[test]
    fn a_rerun_of_nothing_or_of_strangers_is_refused() {
        let m = sweep(6);
        let lost = RerunChoice {
            statuses: vec!["lost"],
            tasks: None,
        };
        let e = choose(&m, "s-1", &ended(), &lost).unwrap_err();
        assert!(
            e.message().unwrap().contains("no task of s-1 ended lost"),
            "{e:?}"
        );
        let beyond = RerunChoice {
            statuses: vec![],
            tasks: Some("5-6".parse().unwrap()),
        };
        let e = choose(&m, "s-1", &ended(), &beyond).unwrap_err();
        assert!(
            e.message()
                .unwrap()
                .contains("task 6 is not one of s-1's tasks (0-5)"),
            "{e:?}"
        );
    }

    #[test]
    fn a_rerun_of_a_rerun_chooses_among_its_tasks() {
        let mut m = sweep(10);
        m.rerun = Some(Rerun {
            of: "s-1".to_owned(),
            tasks: "1,4".parse().unwrap(),
            results: None,
        });
        let choice = RerunChoice {
            statuses: vec![],
            tasks: Some("0".parse().unwrap()),
        };
        assert!(choose(&m, "s-2", &ended(), &choice).is_err());
        assert_eq!(
            choose(&m, "s-2", &ended(), &RerunChoice::default())
                .unwrap()
                .to_string(),
            "1,4"
        );
    }
}
