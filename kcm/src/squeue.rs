//! Slurm's `sinfo` and `squeue`, read into a [`Snapshot`]. Pure: the text
//! in, the snapshot out (the commands are run by `slurm.rs`).
//!
//! `squeue --json` ignores every filter and format flag in Slurm 22.05, so
//! both commands print delimited fields ([`SINFO_FORMAT`], [`squeue_format`]).

use std::collections::{BTreeMap, BTreeSet};

use gleaner_manifest::{Memory, Needs};
use gleaner_policy::local::WaitingJob;

use crate::snapshot::{Host, NamedJob, Snapshot, Standing, Timing, named_after};

/// `sinfo -h -N -O`: node, partition, CPUs, allocated/idle/other/total
/// CPUs, state, generic resources configured and in use (`gpu:2`,
/// `gpu:1(IDX:0)`), memory allocated and in all (MB), the partition's
/// priority tier.
pub const SINFO_FIELDS: &str = "NodeList:|,Partition:|,CPUs:|,CPUsState:|,StateLong:|,Gres:|,GresUsed:|,AllocMem:|,Memory:|,PriorityTier:|";

/// `squeue -h -r`'s fields: job id (`123_4` for an array task), owner's
/// user name, state, nodes, CPUs, node count, whether it shares nodes
/// (`NO`: exclusive), partitions, pending reason, memory per node,
/// generic resources per node (`gres:gpu:1`), time limit, start time
/// (expected, while it waits; seconds since the epoch:
/// `SLURM_TIME_FORMAT=%s` in squeue's environment), priority, name.
const SQUEUE_FIELDS: &str = "%i|%u|%T|%N|%C|%D|%h|%P|%r|%m|%b|%l|%S|%Q|%j";

/// The format `squeue` prints jobs in: each job's [`SQUEUE_FIELDS`] after
/// `marker`, on a line of its own. A job's name is anybody's to choose,
/// `|` and newlines included, so it goes last, where it cannot shift the
/// other fields, and a job starts only at a line that starts with the
/// marker: a name with lines of its own, made to look like jobs (root's
/// `gl-<job>`, say), stays one name as long as its owner cannot know the
/// marker — one made anew for each reading, and not on squeue's command
/// line, which anybody can see.
pub fn squeue_format(marker: &str) -> String {
    format!("{marker}|{SQUEUE_FIELDS}")
}

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
    /// Memory and GPUs nobody holds; `None` from a reading without them.
    free_memory_mb: Option<u64>,
    free_gpus: Option<u32>,
}

/// One line of `squeue`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job<'a> {
    id: &'a str,
    user: &'a str,
    name: &'a str,
    state: &'a str,
    nodes: Vec<String>,
    cpus: u32,
    node_count: u32,
    exclusive: bool,
    reason: &'a str,
    partitions: Vec<&'a str>,
    /// Memory and GPUs it asks for on each of its nodes.
    per_node: Needs,
    limit_ms: Option<u64>,
    /// When it started or, waiting, is expected to (ms since the epoch).
    start: Option<u64>,
    priority: u64,
}

impl Job<'_> {
    fn running(&self) -> bool {
        !matches!(self.state, "PENDING" | "REQUEUED" | "REQUEUE_HOLD")
    }

    /// Whether it waits for slots that the partition's nodes have (in a
    /// partition in `sharing`), and not for anything else (a hold, a
    /// dependency, a limit).
    fn waits_for_slots(&self, sharing: &BTreeSet<String>) -> bool {
        !self.running()
            && WAITING_FOR_SLOTS.contains(&self.reason)
            && self.partitions.iter().any(|p| sharing.contains(*p))
    }

    /// Where it stands in the queue for the nodes of the partitions in
    /// `sharing`: its lowest tier among them (Slurm weighs a job in each of
    /// its partitions), then its priority; `None` when a tier is unknown.
    fn standing(
        &self,
        tiers: &BTreeMap<String, u32>,
        sharing: &BTreeSet<String>,
    ) -> Option<Standing> {
        let mut tier = None::<u32>;
        for partition in self.partitions.iter().filter(|p| sharing.contains(**p)) {
            let this = *tiers.get(*partition)?;
            tier = Some(tier.map_or(this, |t| t.min(this)));
        }
        Some(Standing {
            tier: tier?,
            priority: self.priority,
        })
    }

    /// Its slots and times, for estimates.
    fn timing(&self) -> Timing {
        Timing {
            slots: self.cpus.max(1),
            running: self.running(),
            limit_ms: self.limit_ms,
            start: self.start,
        }
    }

    /// The local job it is while it waits.
    fn waiting(&self) -> WaitingJob {
        WaitingJob {
            id: self.id.to_owned(),
            slots: self.cpus.max(1),
            together: match self.node_count {
                1 => self.cpus.max(1),
                _ => 1,
            },
            exclusive: self.exclusive,
            needs: self.per_node.times(self.node_count.max(1)),
        }
    }
}

/// GPUs of `resource` in a list of generic resources as Slurm prints
/// them: `gpu:2`, `gpu:tesla:2(S:0-1)`, `gpu:1(IDX:0,2),shard:0`.
fn gres_count(list: &str, resource: &str) -> u32 {
    let mut depth = 0;
    let mut items = Vec::new();
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items
        .into_iter()
        .map(|item| item.split('(').next().unwrap_or_default())
        .filter_map(|item| {
            let item = item
                .trim()
                .trim_start_matches("gres:")
                .trim_start_matches("gres/");
            let (name, rest) = item.split_once(':')?;
            (name == resource).then(|| rest.rsplit(':').next()?.parse::<u32>().ok())?
        })
        .sum()
}

/// A memory figure as Slurm prints it (`3000M`, `4G`, `2000` in MB).
fn slurm_memory(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.parse::<u64>() {
        Ok(mb) => Some(mb),
        Err(_) => Memory::parse(text).ok().map(|m| m.0),
    }
}

/// What `sinfo` says of a partition: its nodes, the partitions sharing
/// them, and each partition's priority tier where it gave them.
struct NodesReading {
    nodes: Vec<Node>,
    sharing: BTreeSet<String>,
    tiers: BTreeMap<String, u32>,
}

/// The partition's nodes from `sinfo`, the other partitions sharing
/// them (whose waiting jobs want the same slots), and the priority tier
/// of each partition, where `sinfo` gave it. GPUs are those of
/// `gpu_resource`.
fn read_nodes(sinfo: &str, partition: &str, gpu_resource: &str) -> Result<NodesReading, String> {
    let mut rows = Vec::new();
    let mut tiers = BTreeMap::new();
    for line in sinfo.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields: Vec<&str> = line.trim_end_matches('|').split('|').collect();
        let tier = match fields.len() {
            10 => fields.pop(),
            _ => None,
        };
        let (name, part, cpus, usage, state, resources) = match fields[..] {
            [name, part, cpus, usage, state] => (name, part, cpus, usage, state, None),
            [
                name,
                part,
                cpus,
                usage,
                state,
                gres,
                used,
                allocated,
                memory,
            ] => (
                name,
                part,
                cpus,
                usage,
                state,
                Some((gres, used, allocated, memory)),
            ),
            _ => return Err(format!("unexpected sinfo line {line:?}")),
        };
        let (free_memory_mb, free_gpus) = match resources {
            Some((gres, used, allocated, memory)) => (
                slurm_memory(memory)
                    .zip(slurm_memory(allocated))
                    .map(|(memory, allocated)| memory.saturating_sub(allocated)),
                Some(gres_count(gres, gpu_resource).saturating_sub(gres_count(used, gpu_resource))),
            ),
            None => (None, None),
        };
        let number = |text: &str| {
            text.trim()
                .parse::<u32>()
                .map_err(|_| format!("unexpected sinfo line {line:?}"))
        };
        let allocated = usage.split('/').next().map_or(Ok(0), number)?;
        // The default partition is starred.
        let part = part.trim_end_matches('*');
        if let Some(tier) = tier {
            tiers.insert(part.to_owned(), number(tier)?);
        }
        rows.push((
            part.to_owned(),
            Node {
                name: name.to_owned(),
                cpus: number(cpus)?,
                allocated,
                usable: !UNUSABLE.iter().any(|u| state.contains(u)),
                state: state.to_owned(),
                free_memory_mb,
                free_gpus,
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
    Ok(NodesReading {
        nodes,
        sharing,
        tiers,
    })
}

/// The jobs of `squeue` output in [`squeue_format`]`(marker)`, GPUs
/// those of `gpu_resource`.
fn read_jobs<'a>(
    squeue: &'a str,
    marker: &str,
    gpu_resource: &str,
) -> Result<Vec<Job<'a>>, String> {
    let start = format!("{marker}|");
    if squeue.trim().is_empty() {
        return Ok(Vec::new());
    }
    let Some(first) = squeue.strip_prefix(&start) else {
        return Err(format!(
            "unexpected squeue output {:?}",
            squeue.lines().next().unwrap_or_default()
        ));
    };
    let mut jobs = Vec::new();
    for line in first.split(&format!("\n{start}")) {
        let line = line.strip_suffix('\n').unwrap_or(line);
        // The name, last, keeps whatever `|` and lines it has.
        let fields: Vec<&str> = line.splitn(15, '|').collect();
        let [
            id,
            user,
            state,
            nodes,
            cpus,
            count,
            shared,
            partitions,
            reason,
            memory,
            gres,
            limit,
            start,
            priority,
            name,
        ] = fields[..]
        else {
            return Err(format!("unexpected squeue line {line:?}"));
        };
        let number = |text: &str| {
            text.trim()
                .parse::<u32>()
                .map_err(|_| format!("unexpected squeue line {line:?}"))
        };
        jobs.push(Job {
            id,
            user,
            name,
            state,
            nodes: expand_hostlist(nodes),
            cpus: number(cpus)?,
            node_count: number(count)?,
            exclusive: shared == "NO",
            reason,
            partitions: partitions.split(',').collect(),
            per_node: Needs {
                memory_mb: slurm_memory(memory).unwrap_or(0),
                gpus: gres_count(gres, gpu_resource),
            },
            limit_ms: slurm_duration_ms(limit),
            start: start
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|s| *s > 0)
                .and_then(|s| s.checked_mul(1000)),
            priority: priority
                .trim()
                .parse()
                .map_err(|_| format!("unexpected squeue line {line:?}"))?,
        });
    }
    Ok(jobs)
}

/// Where jobs run, as `squeue` (in [`squeue_format`]`(marker)`) shows
/// them: `sinfo`'s reading of the nodes' free slots, memory and GPUs
/// changes only when this does, or when a node's state does.
pub fn allocations(squeue: &str, marker: &str) -> Result<BTreeSet<(String, String)>, String> {
    Ok(read_jobs(squeue, marker, "")?
        .into_iter()
        .filter(Job::running)
        .map(|job| (job.id.to_owned(), job.nodes.join(",")))
        .collect())
}

/// Reads `sinfo` and `squeue` output into the partition's snapshot: its
/// nodes, the slots of jobs running there and the jobs waiting for them.
/// Jobs in the partition named like gleaner's are left [`NamedJob`], with
/// their owners (`%u`), for the kcm's core to judge, each with what it is
/// as someone else's too.
///
/// `squeue` is in [`squeue_format`]`(marker)`.
pub fn snapshot(
    sinfo: &str,
    squeue: &str,
    marker: &str,
    partition: &str,
    gpu_resource: &str,
) -> Result<Snapshot, String> {
    let NodesReading {
        nodes,
        sharing,
        tiers,
    } = read_nodes(sinfo, partition, gpu_resource)?;
    let jobs = read_jobs(squeue, marker, gpu_resource)?;
    let ours = |job: &Job| job.partitions.contains(&partition);
    let node_names: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let mut snapshot = Snapshot {
        placeholder_tier: tiers.get(partition).copied(),
        ..Snapshot::default()
    };
    // CPUs of named jobs running per node, to tell the others' apart.
    let mut named_cpus: BTreeMap<&str, u32> = BTreeMap::new();
    for job in jobs.iter().filter(|j| j.waits_for_slots(&sharing)) {
        if let Some(standing) = job.standing(&tiers, &sharing) {
            snapshot.standings.insert(job.id.to_owned(), standing);
        }
    }
    for job in &jobs {
        let Some((named, component)) = named_after(job.name).filter(|_| ours(job)) else {
            if job.waits_for_slots(&sharing) {
                snapshot.waiting.push(job.waiting());
                snapshot.timing.push(job.timing());
            } else if job.running() && job.nodes.iter().any(|n| node_names.contains(n.as_str())) {
                snapshot.timing.push(job.timing());
            }
            continue;
        };
        let hosts = match job.running() {
            true => split_over(job.cpus, &job.nodes),
            false => Vec::new(),
        };
        for &(node, cpus) in &hosts {
            let sum = named_cpus.entry(node).or_default();
            *sum = sum.saturating_add(cpus);
        }
        snapshot.named.push(NamedJob {
            job: named,
            component,
            owner: job.user.to_owned(),
            ids: vec![job.id.to_owned()],
            slots: job.cpus.max(1),
            hosts: hosts
                .into_iter()
                .map(|(node, cpus)| (node.to_owned(), cpus))
                .collect(),
            waiting: job.waits_for_slots(&sharing).then(|| job.waiting()),
            problem: None,
            needs: job.per_node.times(job.node_count.max(1)),
            timing: job.timing(),
        });
    }
    let mut problems = Vec::new();
    for node in &nodes {
        if !node.usable {
            problems.push(format!("node {} is {}", node.name, node.state));
        }
        let name = node.name.as_str();
        let named = named_cpus.get(name).copied().unwrap_or(0);
        snapshot.hosts.push(Host {
            local: node.allocated.saturating_sub(named),
            free_memory_mb: node.free_memory_mb,
            free_gpus: node.free_gpus,
            ..Host::new(name, if node.usable { node.cpus } else { 0 })
        });
    }
    snapshot.problem = (!problems.is_empty()).then(|| problems.join("; "));
    Ok(snapshot)
}

/// A duration as Slurm prints one (`[days-]hours:minutes:seconds`,
/// `minutes:seconds`, `minutes`); `None` for `UNLIMITED`, `NOT_SET`,
/// `INVALID` and anything else.
fn slurm_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let (days, rest) = match text.split_once('-') {
        Some((days, rest)) => (days.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let seconds = match parts[..] {
        [h, m, s] => h * 3600 + m * 60 + s,
        [m, s] => m * 60 + s,
        [m] => m * 60,
        _ => return None,
    };
    days.checked_mul(86_400)?
        .checked_add(seconds)?
        .checked_mul(1000)
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
mod tests;
