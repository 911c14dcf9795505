//! What a task's run is given and what it leaves behind, decided apart
//! from running it: its environment, and whether its checkpoint is kept
//! for another run.

use std::path::Path;

use gleaner_protocol::{RunStatus, TaskMsg};

/// The variables by which GPU runtimes (CUDA, ROCm, OpenCL) and Slurm
/// name the devices a process may use.
const DEVICE_VARIABLES: [&str; 5] = [
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "SLURM_STEP_GPUS",
];

/// The task's environment: its manifest's, then gleaner's own variables
/// (which the manifest cannot override), and `OMP_NUM_THREADS` set to its
/// slots unless the manifest set it: a threaded library uses the task's
/// slots, not every core of the host. `checkpoint` is its directory and
/// the most it may hold, when it has one; `gpus` its devices.
pub fn environment(
    task: &TaskMsg,
    task_slots: u32,
    gpus: &[String],
    checkpoint: Option<(&Path, u64)>,
) -> Vec<(String, String)> {
    // Devices are the launcher's to give: a task is given exactly its own,
    // whatever its manifest or its placeholder's environment says, and
    // none if it asked for none.
    let mut env: Vec<(String, String)> = task
        .env
        .iter()
        .filter(|(key, _)| !DEVICE_VARIABLES.contains(&key.as_str()))
        .cloned()
        .collect();
    if !env.iter().any(|(key, _)| key == "OMP_NUM_THREADS") {
        env.push(("OMP_NUM_THREADS".to_owned(), task_slots.to_string()));
    }
    let devices = gpus.join(",");
    env.extend([
        ("GLEANER_JOB".to_owned(), task.job.to_string()),
        ("GLEANER_TASK".to_owned(), task.task.to_string()),
        ("GLEANER_ATTEMPT".to_owned(), task.attempt.to_string()),
        ("GLEANER_SLOTS".to_owned(), task_slots.to_string()),
        ("GLEANER_GPUS".to_owned(), devices.clone()),
    ]);
    env.extend(
        DEVICE_VARIABLES
            .iter()
            .map(|key| ((*key).to_owned(), devices.clone())),
    );
    if let Some((dir, max_bytes)) = checkpoint {
        env.extend([
            ("GLEANER_CHECKPOINT".to_owned(), dir.display().to_string()),
            (
                "GLEANER_CHECKPOINT_MAX_BYTES".to_owned(),
                max_bytes.to_string(),
            ),
        ]);
    }
    env
}

/// A task that ended for good (succeeded, out of memory, or failed its
/// last attempt)
/// needs its checkpoint no more; one preempted, stopped or failed before
/// its last attempt keeps it for its next run.
pub fn ended_for_good(task: &TaskMsg, status: Option<RunStatus>) -> bool {
    matches!(status, Some(RunStatus::Succeeded | RunStatus::Oom))
        || (status.is_some() && task.max_attempts > 0 && task.attempt >= task.max_attempts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(attempt: u32, max_attempts: u32) -> TaskMsg {
        TaskMsg {
            job: "sweep-0123456789abcdef".parse().unwrap(),
            task: 7,
            attempt,
            preemptions: 0,
            command: "true".into(),
            env: vec![
                ("OMP_NUM_THREADS".into(), "1".into()),
                ("X".into(), "y".into()),
            ],
            walltime_ms: None,
            outputs: Vec::new(),
            workdir: None,
            preempt_signal: None,
            preempt_grace_ms: None,
            max_attempts,
            shape: None,
        }
    }

    fn value<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
        env.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_task_gets_its_slots_and_gleaners_variables_after_its_own() {
        let mut own = task(2, 3);
        let env = environment(&own, 4, &[], Some((Path::new("/ck/7"), 1024)));
        assert_eq!(
            value(&env, "OMP_NUM_THREADS"),
            Some("1"),
            "the manifest's wins"
        );
        assert_eq!(value(&env, "GLEANER_SLOTS"), Some("4"));
        assert_eq!(value(&env, "GLEANER_TASK"), Some("7"));
        assert_eq!(value(&env, "GLEANER_ATTEMPT"), Some("2"));
        assert_eq!(value(&env, "GLEANER_CHECKPOINT"), Some("/ck/7"));
        assert_eq!(value(&env, "GLEANER_CHECKPOINT_MAX_BYTES"), Some("1024"));
        own.env = vec![("GLEANER_TASK".into(), "99".into())];
        let env = environment(&own, 4, &["1".to_owned()], None);
        assert_eq!(value(&env, "OMP_NUM_THREADS"), Some("4"));
        assert_eq!(
            value(&env, "GLEANER_TASK"),
            Some("7"),
            "gleaner's own come last"
        );
        assert_eq!(value(&env, "GLEANER_CHECKPOINT"), None);
        assert_eq!(value(&env, "GLEANER_GPUS"), Some("1"));
    }

    #[test]
    fn a_task_sees_exactly_its_own_gpus() {
        let mut own = task(1, 3);
        own.env = vec![("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3".into())];
        let env = environment(&own, 1, &["2".to_owned(), "3".to_owned()], None);
        let devices: Vec<&str> = env
            .iter()
            .filter(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(devices, ["2,3"], "the manifest's own is dropped");
        assert_eq!(value(&env, "ROCR_VISIBLE_DEVICES"), Some("2,3"));
        assert_eq!(value(&env, "GLEANER_GPUS"), Some("2,3"));
        let env = environment(&own, 1, &[], None);
        assert_eq!(
            value(&env, "CUDA_VISIBLE_DEVICES"),
            Some(""),
            "none asked, none seen"
        );
    }

    #[test]
    fn a_checkpoint_is_kept_until_the_task_ends_for_good() {
        assert!(ended_for_good(&task(1, 3), Some(RunStatus::Succeeded)));
        assert!(!ended_for_good(&task(1, 3), Some(RunStatus::Failed)));
        assert!(ended_for_good(&task(3, 3), Some(RunStatus::Failed)));
        assert!(
            !ended_for_good(&task(3, 3), None),
            "stopped before it ended"
        );
        assert!(
            !ended_for_good(&task(9, 0), Some(RunStatus::TimedOut)),
            "no limit"
        );
    }
}
