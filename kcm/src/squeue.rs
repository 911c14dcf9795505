//! Slurm's `sinfo` and `squeue`, read into a [`Snapshot`]. Pure: the text
//! in, the snapshot out (the commands are run by `slurm.rs`).
//!
//! `squeue --json` ignores every filter and format flag in Slurm 22.05, so
//! both commands print delimited fields ([`SINFO_FORMAT`], [`SQUEUE_FORMAT`]).

use std::collections::{BTreeMap, BTreeSet};

use gleaner_policy::local::WaitingJob;
use gleaner_protocol::naming::{parse_component_name, parse_placeholder_name};

use crate::snapshot::{ComponentRun, Host, Placeholder, Snapshot};

/// `sinfo -h -N -o`: node, partition, CPUs, allocated/idle/other/total
/// CPUs, state.
pub const SINFO_FORMAT: &str = "%N|%P|%c|%C|%T";

/// `squeue -h -r -o`: job id (`123_4` for an array task), name, state,
/// nodes, CPUs, node count, whether it shares nodes (`NO`: exclusive),
/// pending reason, partitions.
pub const SQUEUE_FORMAT: &str = "%i|%j|%T|%N|%C|%D|%h|%r|%P";

/// Pending reasons that mean a job waits for slots somebody holds.
const WAITING_FOR_SLOTS: [&str; 3] = ["Resources", "Priority", "None"];

/// Node states in which a node runs nothing new.
const UNUSABLE: [&str; 6] = ["down", "drain", "fail", "maint", "unk", "inval"];

/// A node as `sinfo` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    name: String,
    cpus: u32,
    allocated: u32,
    usable: bool,
    state: String,
}

/// One line of `squeue`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job<'a> {
    id: &'a str,
    name: &'a str,
    state: &'a str,
    nodes: Vec<String>,
    cpus: u32,
    node_count: u32,
    exclusive: bool,
    reason: &'a str,
    partitions: Vec<&'a str>,
}

impl Job<'_> {
    fn running(&self) -> bool {
        !matches!(self.state, "PENDING" | "REQUEUED" | "REQUEUE_HOLD")
    }
}

/// The partition's nodes from `sinfo`, and the other partitions sharing
/// them (whose waiting jobs want the same slots).
fn read_nodes(sinfo: &str, partition: &str) -> Result<(Vec<Node>, BTreeSet<String>), String> {
    let mut rows = Vec::new();
    for line in sinfo.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('|').collect();
        let [name, part, cpus, usage, state] = fields[..] else {
            return Err(format!("unexpected sinfo line {line:?}"));
        };
        let number = |text: &str| {
            text.trim()
                .parse::<u32>()
                .map_err(|_| format!("unexpected sinfo line {line:?}"))
        };
        let allocated = usage.split('/').next().map_or(Ok(0), number)?;
        // The default partition is starred.
        let part = part.trim_end_matches('*');
        rows.push((
            part.to_owned(),
            Node {
                name: name.to_owned(),
                cpus: number(cpus)?,
                allocated,
                usable: !UNUSABLE.iter().any(|u| state.contains(u)),
                state: state.to_owned(),
            },
        ));
    }
    let nodes: Vec<Node> = rows
        .iter()
        .filter(|(part, _)| part == partition)
        .map(|(_, node)| node.clone())
        .collect();
    if nodes.is_empty() {
        return Err(format!(
            "partition {partition} has no nodes (`sinfo -s` lists the partitions)"
        ));
    }
    let names: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let sharing = rows
        .iter()
        .filter(|(_, node)| names.contains(node.name.as_str()))
        .map(|(part, _)| part.clone())
        .collect();
    Ok((nodes, sharing))
}

fn read_jobs(squeue: &str) -> Result<Vec<Job<'_>>, String> {
    let mut jobs = Vec::new();
    for line in squeue.lines().filter(|l| !l.trim().is_empty()) {
        // The reason may be free text: the fields around it are fixed.
        let fields: Vec<&str> = line.splitn(8, '|').collect();
        let [id, name, state, nodes, cpus, count, shared, rest] = fields[..] else {
            return Err(format!("unexpected squeue line {line:?}"));
        };
        let Some((reason, partitions)) = rest.rsplit_once('|') else {
            return Err(format!("unexpected squeue line {line:?}"));
        };
        let number = |text: &str| {
            text.trim()
                .parse::<u32>()
                .map_err(|_| format!("unexpected squeue line {line:?}"))
        };
        jobs.push(Job {
            id,
            name,
            state,
            nodes: expand_hostlist(nodes),
            cpus: number(cpus)?,
            node_count: number(count)?,
            exclusive: shared == "NO",
            reason,
            partitions: partitions.split(',').collect(),
        });
    }
    Ok(jobs)
}

/// Reads `sinfo` and `squeue` output into the partition's snapshot: its
/// nodes, the placeholders and components of gleaner in it, the slots of
/// everybody else's jobs running there, and their jobs waiting for them.
pub fn snapshot(sinfo: &str, squeue: &str, partition: &str) -> Result<Snapshot, String> {
    let (nodes, sharing) = read_nodes(sinfo, partition)?;
    let jobs = read_jobs(squeue)?;
    let ours = |job: &Job| job.partitions.contains(&partition);
    let mut snapshot = Snapshot::default();
    // CPUs of gleaner's running jobs per node, to tell the others' apart.
    let mut gleaner_cpus: BTreeMap<&str, u32> = BTreeMap::new();
    let mut grid_cpus: BTreeMap<&str, u32> = BTreeMap::new();
    for job in &jobs {
        if let Some(owner) = parse_placeholder_name(job.name).filter(|_| ours(job)) {
            let node = job.nodes.first().filter(|_| job.running());
            if let Some(node) = node {
                *gleaner_cpus.entry(node.as_str()).or_default() += job.cpus;
            }
            snapshot.placeholders.push(Placeholder {
                id: job.id.to_owned(),
                job: owner,
                slots: job.cpus.max(1),
                host: node.cloned(),
            });
        } else if let Some((owner, component)) =
            parse_component_name(job.name).filter(|_| ours(job))
        {
            if job.running() {
                for (node, cpus) in split_over(job.cpus, &job.nodes) {
                    *gleaner_cpus.entry(node).or_default() += cpus;
                    *grid_cpus.entry(node).or_default() += cpus;
                }
            }
            snapshot.components.push(ComponentRun {
                id: job.id.to_owned(),
                job: owner,
                component,
                slots: job.cpus.max(1),
                running: job.running(),
            });
        } else if !job.running()
            && WAITING_FOR_SLOTS.contains(&job.reason)
            && job.partitions.iter().any(|p| sharing.contains(*p))
        {
            snapshot.waiting.push(WaitingJob {
                id: job.id.to_owned(),
                slots: job.cpus.max(1),
                together: match job.node_count {
                    1 => job.cpus.max(1),
                    _ => 1,
                },
                exclusive: job.exclusive,
            });
        }
    }
    let mut problems = Vec::new();
    for node in &nodes {
        if !node.usable {
            problems.push(format!("node {} is {}", node.name, node.state));
        }
        let name = node.name.as_str();
        let gleaner = gleaner_cpus.get(name).copied().unwrap_or(0);
        snapshot.hosts.push(Host {
            local: node.allocated.saturating_sub(gleaner),
            grid: grid_cpus.get(name).copied().unwrap_or(0),
            ..Host::new(name, if node.usable { node.cpus } else { 0 })
        });
    }
    snapshot.problem = (!problems.is_empty()).then(|| problems.join("; "));
    Ok(snapshot)
}

/// A job's CPUs over its nodes, as even as they go (Slurm's list does not
/// say how they are split).
fn split_over(cpus: u32, nodes: &[String]) -> Vec<(&str, u32)> {
    let count = nodes.len() as u32;
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let extra = u32::from((i as u32) < cpus % count.max(1));
            (node.as_str(), cpus / count.max(1) + extra)
        })
        .collect()
}

/// Expands a Slurm host list: `node[1-3,5],vm` → node1 node2 node3 node5 vm
/// (zero padding kept: `n[08-10]` → n08 n09 n10).
pub fn expand_hostlist(list: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        let end = rest.find([',', '[']).unwrap_or(rest.len());
        let prefix = &rest[..end];
        rest = &rest[end..];
        if let Some(ranges) = rest.strip_prefix('[') {
            let close = ranges.find(']').unwrap_or(ranges.len());
            let (body, after) = ranges.split_at(close);
            let after = after.strip_prefix(']').unwrap_or(after);
            // A suffix after the brackets (`a[1-2]b`) is rare enough to keep whole.
            let suffix_end = after.find(',').unwrap_or(after.len());
            let suffix = &after[..suffix_end];
            for range in body.split(',') {
                hosts.extend(expand_range(prefix, range, suffix));
            }
            rest = &after[suffix_end..];
        } else if !prefix.is_empty() {
            hosts.push(prefix.to_owned());
        }
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    hosts
}

fn expand_range(prefix: &str, range: &str, suffix: &str) -> Vec<String> {
    let (low, high) = range.split_once('-').unwrap_or((range, range));
    let width = low.len();
    match (low.parse::<u64>(), high.parse::<u64>()) {
        (Ok(low), Ok(high)) if low <= high && high - low < 100_000 => (low..=high)
            .map(|n| format!("{prefix}{n:0width$}{suffix}"))
            .collect(),
        _ => vec![format!("{prefix}{range}{suffix}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy partition in the commands' formats: three 4-CPU nodes, a
    /// sweep's placeholders, a component over two nodes, others' jobs.
    const SINFO: &str = "node1|gleaner*|4|4/0/0/4|allocated\n\
        node1|local|4|4/0/0/4|allocated\n\
        node2|gleaner*|4|3/1/0/4|mixed\n\
        node2|local|4|3/1/0/4|mixed\n\
        node3|gleaner*|4|3/1/0/4|mixed\n\
        node3|local|4|3/1/0/4|mixed\n\
        vm|solo|4|0/4/0/4|idle\n";

    const SQUEUE: &str = "10_1|gl-sweep-00000000000beef0|RUNNING|node1|1|1|OK|None|gleaner\n\
        10_2|gl-sweep-00000000000beef0|RUNNING|node1|1|1|OK|None|gleaner\n\
        10_3|gl-sweep-00000000000beef0|PENDING||1|1|OK|Priority|gleaner\n\
        11|gg-mpi-00000000000beef0.0|RUNNING|node[2-3]|6|2|OK|None|gleaner\n\
        12|wrap|RUNNING|node1|2|1|OK|None|local\n\
        13|whole|PENDING||4|1|OK|Resources|local\n\
        14|spread|PENDING||6|2|OK|Priority|local\n\
        15|alone|PENDING||1|1|NO|Priority|local\n\
        16|held|PENDING||1|1|OK|JobHeldUser|local\n\
        17|elsewhere|PENDING||1|1|OK|Resources|solo\n\
        18|gl-other-00000000000beef0|PENDING||1|1|OK|Priority|solo\n";

    #[test]
    fn host_lists_expand() {
        assert_eq!(
            expand_hostlist("node[1-3,5],vm"),
            ["node1", "node2", "node3", "node5", "vm"]
        );
        assert_eq!(expand_hostlist("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(expand_hostlist(""), Vec::<String>::new());
        assert_eq!(expand_hostlist("a,b"), ["a", "b"]);
    }

    #[test]
    fn a_busy_partition() {
        let s = snapshot(SINFO, SQUEUE, "gleaner").unwrap();
        let hosts: Vec<(&str, u32, u32, u32)> = s
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), h.slots, h.local, h.grid))
            .collect();
        assert_eq!(
            hosts,
            [("node1", 4, 2, 0), ("node2", 4, 0, 3), ("node3", 4, 0, 3)],
            "node1: two launchers and a 2-CPU local job; the component split over two nodes"
        );
        let placeholders: Vec<(&str, Option<&str>)> = s
            .placeholders
            .iter()
            .map(|p| (p.id.as_str(), p.host.as_deref()))
            .collect();
        assert_eq!(
            placeholders,
            [
                ("10_1", Some("node1")),
                ("10_2", Some("node1")),
                ("10_3", None)
            ],
            "the other partition's placeholder is another cluster's"
        );
        assert_eq!(s.components.len(), 1);
        assert!(s.components[0].running);
        let waiting: Vec<(&str, u32, u32, bool)> = s
            .waiting
            .iter()
            .map(|w| (w.id.as_str(), w.slots, w.together, w.exclusive))
            .collect();
        assert_eq!(
            waiting,
            [("13", 4, 4, false), ("14", 6, 1, false), ("15", 1, 1, true)],
            "held jobs and other partitions' jobs are not waiting for these slots"
        );
        assert!(s.problem.is_none());
    }

    #[test]
    fn down_nodes_offer_nothing_and_are_reported() {
        let sinfo = "node1|gleaner*|4|0/0/4/4|down*\nnode2|gleaner*|4|0/4/0/4|idle\n";
        let s = snapshot(sinfo, "", "gleaner").unwrap();
        assert_eq!(s.total_slots(), 4);
        assert_eq!(s.problem.as_deref(), Some("node node1 is down*"));
    }

    #[test]
    fn unknown_partitions_and_garbage_are_errors() {
        assert!(
            snapshot(SINFO, "", "nope")
                .unwrap_err()
                .contains("no nodes")
        );
        assert!(snapshot("garbage", "", "gleaner").is_err());
        assert!(snapshot(SINFO, "1|x|RUNNING", "gleaner").is_err());
    }
}
