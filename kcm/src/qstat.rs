//! Reading Grid Engine's `qstat -f -r -xml` into a [`Snapshot`] of one
//! cluster queue. Pure: the command is run elsewhere.

use gleaner_policy::local::WaitingJob;
use gleaner_protocol::naming::{parse_component_name, parse_placeholder_name};
use serde::Deserialize;

use crate::snapshot::{ComponentRun, Placeholder, Snapshot};

#[derive(Debug, Default, Deserialize)]
struct Root {
    #[serde(default)]
    queue_info: QueueInfo,
    #[serde(default)]
    job_info: PendingInfo,
}

#[derive(Debug, Default, Deserialize)]
struct QueueInfo {
    #[serde(rename = "Queue-List", default)]
    queues: Vec<QueueInstance>,
}

#[derive(Debug, Default, Deserialize)]
struct PendingInfo {
    #[serde(default)]
    job_list: Vec<JobEntry>,
}

#[derive(Debug, Deserialize)]
struct QueueInstance {
    name: String,
    #[serde(default)]
    slots_total: u32,
    /// Letters such as `a` (alarm), `u` (unknown), `E` (error), `d` (disabled).
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    job_list: Vec<JobEntry>,
}

#[derive(Debug, Deserialize)]
struct JobEntry {
    #[serde(rename = "JB_job_number")]
    number: u64,
    #[serde(rename = "JB_name")]
    name: String,
    state: String,
    #[serde(default)]
    slots: u32,
    /// One task id when running; ranges like `2-8:1,10` when pending.
    #[serde(default)]
    tasks: Option<String>,
}

/// Queue instance states in which it runs nothing new.
const UNUSABLE: &[char] = &['a', 'u', 'E', 'd', 's', 'S', 'D', 'C', 'o'];

/// Turns `qstat -f -r -xml -q <queue> -u '*'` output into the cluster's
/// snapshot. `Err` carries what was wrong with the output.
pub fn snapshot(xml: &str, queue: &str) -> Result<Snapshot, String> {
    let root: Root =
        quick_xml::de::from_str(xml).map_err(|e| format!("unreadable qstat XML: {e}"))?;
    let instance_prefix = format!("{queue}@");
    let mut snapshot = Snapshot::default();
    let mut problems = Vec::new();
    let mut instances = 0;
    for instance in root
        .queue_info
        .queues
        .iter()
        .filter(|q| q.name.starts_with(&instance_prefix))
    {
        instances += 1;
        let state = instance.state.as_deref().unwrap_or("");
        if state.contains(UNUSABLE) {
            problems.push(format!("{} is in state {state}", instance.name));
        } else {
            snapshot.total_slots = snapshot.total_slots.saturating_add(instance.slots_total);
        }
        for job in &instance.job_list {
            let id = match &job.tasks {
                Some(task) => format!("{}.{task}", job.number),
                None => job.number.to_string(),
            };
            if let Some(owner) = parse_placeholder_name(&job.name) {
                snapshot.placeholders.push(Placeholder {
                    id,
                    job: owner,
                    slots: job.slots.max(1),
                    running: true,
                });
            } else if let Some((owner, component)) = parse_component_name(&job.name) {
                snapshot.grid_running = snapshot.grid_running.saturating_add(job.slots);
                snapshot.components.push(ComponentRun {
                    id,
                    job: owner,
                    component,
                    slots: job.slots.max(1),
                    running: true,
                });
            } else {
                snapshot.local_running = snapshot.local_running.saturating_add(job.slots);
            }
        }
    }
    if instances == 0 {
        return Err(format!("no queue {queue} in the batch system"));
    }
    for job in &root.job_info.job_list {
        let tasks = match &job.tasks {
            Some(ranges) => expand_tasks(ranges),
            None => vec![None],
        };
        if let Some((owner, component)) = parse_component_name(&job.name) {
            snapshot.components.push(ComponentRun {
                id: job.number.to_string(),
                job: owner,
                component,
                slots: job.slots.max(1),
                running: false,
            });
            continue;
        }
        match parse_placeholder_name(&job.name) {
            Some(owner) => {
                if job.state.contains('E') {
                    problems.push(format!(
                        "placeholder job {} is in error state {}",
                        job.number, job.state
                    ));
                }
                snapshot
                    .placeholders
                    .extend(tasks.iter().map(|task| Placeholder {
                        id: match task {
                            Some(task) => format!("{}.{task}", job.number),
                            None => job.number.to_string(),
                        },
                        job: owner.clone(),
                        slots: job.slots.max(1),
                        running: false,
                    }));
            }
            // A job on hold, or in error, is not waiting for slots.
            None if job.state.contains(['h', 'E']) => {}
            None => {
                let copies = (tasks.len() as u32).min(snapshot.total_slots.max(1));
                snapshot.waiting.push(WaitingJob {
                    id: job.number.to_string(),
                    slots: job.slots.max(1).saturating_mul(copies),
                });
            }
        }
    }
    snapshot.problem = (!problems.is_empty()).then(|| problems.join("; "));
    Ok(snapshot)
}

/// `2-8:2,10` → 2, 4, 6, 8, 10. Bounded: a pending array of a million tasks
/// is not a million placeholders to look at.
fn expand_tasks(ranges: &str) -> Vec<Option<u64>> {
    const LIMIT: usize = 100_000;
    let mut tasks = Vec::new();
    for part in ranges.split(',') {
        let (range, step) = part.split_once(':').unwrap_or((part, "1"));
        let step: u64 = step.parse().unwrap_or(1).max(1);
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (a.parse().ok(), b.parse().ok()),
            None => (range.parse().ok(), range.parse().ok()),
        };
        let (Some(first), Some(last)) = (first, last) else {
            continue;
        };
        let mut task: u64 = first;
        while task <= last && tasks.len() < LIMIT {
            tasks.push(Some(task));
            let Some(next) = task.checked_add(step) else {
                break;
            };
            task = next;
        }
    }
    if tasks.is_empty() {
        tasks.push(None);
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../tests/data/qstat-c1.xml");

    #[test]
    fn the_real_output_of_a_busy_queue() {
        let s = snapshot(SAMPLE, "c1.q").unwrap();
        assert_eq!(s.total_slots, 8);
        let running: Vec<&str> = s
            .placeholders
            .iter()
            .filter(|p| p.running)
            .map(|p| p.id.as_str())
            .collect();
        assert_eq!(
            running,
            ["3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7", "3.8"]
        );
        let pending: Vec<&str> = s
            .placeholders
            .iter()
            .filter(|p| !p.running)
            .map(|p| p.id.as_str())
            .collect();
        assert_eq!(pending, ["3.9", "3.10"]);
        assert!(
            s.placeholders
                .iter()
                .all(|p| p.job.as_str() == "sweep-3fa9c2")
        );
        assert_eq!(s.local_running, 0);
        assert_eq!(
            s.waiting,
            [WaitingJob {
                id: "4".into(),
                slots: 2
            }],
            "the held job does not wait for slots"
        );
        assert_eq!(s.problem, None);
    }

    #[test]
    fn grid_components_are_neither_local_nor_placeholders() {
        let xml = r#"<job_info><queue_info><Queue-List><name>c1.q@a</name><slots_total>8</slots_total>
            <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00beef.0</JB_name><state>r</state><slots>4</slots></job_list>
            </Queue-List></queue_info>
            <job_info><job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>gg-mpi-00beef.1</JB_name><state>qw</state><slots>2</slots></job_list></job_info></job_info>"#;
        let s = snapshot(xml, "c1.q").unwrap();
        assert_eq!((s.grid_running, s.local_running), (4, 0));
        assert!(s.waiting.is_empty() && s.placeholders.is_empty());
        assert_eq!(s.components.len(), 2);
        assert_eq!(
            (s.components[1].component, s.components[1].running),
            (1, false)
        );
    }

    #[test]
    fn task_ranges_expand() {
        assert_eq!(expand_tasks("9,10"), [Some(9), Some(10)]);
        assert_eq!(expand_tasks("2-8:3"), [Some(2), Some(5), Some(8)]);
        assert_eq!(expand_tasks("7"), [Some(7)]);
        assert_eq!(expand_tasks("junk"), [None]);
        assert_eq!(expand_tasks("1-1000000:1").len(), 100_000);
        let top = u64::MAX - 1;
        assert_eq!(
            expand_tasks(&format!("{top}-{}:5", u64::MAX)).len(),
            1,
            "no overflow"
        );
    }

    #[test]
    fn broken_queues_and_output_are_reported() {
        let xml = r#"<?xml version='1.0'?><job_info><queue_info><Queue-List><name>c1.q@vm</name><slots_used>0</slots_used><slots_total>8</slots_total><state>E</state></Queue-List></queue_info><job_info></job_info></job_info>"#;
        let s = snapshot(xml, "c1.q").unwrap();
        assert_eq!(s.total_slots, 0);
        assert!(s.problem.unwrap().contains("state E"));
        assert!(snapshot(xml, "c9.q").unwrap_err().contains("no queue c9.q"));
        assert!(snapshot("<html>error</html>", "c1.q").is_err());
        assert!(snapshot("", "c1.q").is_err());
    }

    #[test]
    fn local_jobs_and_other_names_count_as_local() {
        let xml = r#"<job_info><queue_info><Queue-List><name>c1.q@a</name><slots_total>4</slots_total>
            <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gl-not-a-job-id</JB_name><state>r</state><slots>2</slots></job_list>
            </Queue-List><Queue-List><name>c1.q@b</name><slots_total>4</slots_total></Queue-List></queue_info>
            <job_info><job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>array</JB_name><state>qw</state><slots>1</slots><tasks>1-100:1</tasks></job_list></job_info></job_info>"#;
        let s = snapshot(xml, "c1.q").unwrap();
        assert_eq!((s.total_slots, s.local_running), (8, 2));
        assert_eq!(
            s.waiting[0].slots, 8,
            "a pending array wants at most the whole queue"
        );
    }
}
