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

    const SQUEUE: &str = "M|10_1|root|RUNNING|node1|1|1|OK|gleaner|None|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
        M|10_2|root|RUNNING|node1|1|1|OK|gleaner|None|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
        M|10_3|root|PENDING||1|1|OK|gleaner|Priority|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
        M|11|root|RUNNING|node[2-3]|6|2|OK|gleaner|None|0|N/A|2:00:00|N/A|1000|gg-mpi-00000000000beef0.0\n\
        M|12|carol|RUNNING|node1|2|1|OK|local|None|0|N/A|2:00:00|N/A|1000|wrap\n\
        M|13|carol|PENDING||4|1|OK|local|Resources|0|N/A|2:00:00|N/A|1000|whole\n\
        M|14|carol|PENDING||6|2|OK|local|Priority|0|N/A|2:00:00|N/A|1000|spread\n\
        M|15|carol|PENDING||1|1|NO|local|Priority|0|N/A|2:00:00|N/A|1000|alone\n\
        M|16|carol|PENDING||1|1|OK|local|JobHeldUser|0|N/A|2:00:00|N/A|1000|held\n\
        M|17|carol|PENDING||1|1|OK|solo|Resources|0|N/A|2:00:00|N/A|1000|elsewhere\n\
        M|18|root|PENDING||1|1|OK|solo|Priority|0|N/A|2:00:00|N/A|1000|gl-other-00000000000beef0\n";

    /// The snapshot as a kcm running as root with one user judges it.
    fn judged(sinfo: &str, squeue: &str, partition: &str) -> Result<Snapshot, String> {
        snapshot(sinfo, squeue, "M", partition, "gpu").map(|s| s.judge(|job| job.owner == "root"))
    }

    #[test]
    fn time_limits_and_start_times_are_read_for_estimates() {
        for (text, ms) in [
            ("1-02:03:04", Some(((26 * 60 + 3) * 60 + 4) * 1000)),
            ("2:00:00", Some(7_200_000)),
            ("30:00", Some(1_800_000)),
            ("45", Some(2_700_000)),
            ("UNLIMITED", None),
            ("INVALID", None),
            ("1-", None),
        ] {
            assert_eq!(slurm_duration_ms(text), ms, "{text}");
        }
        let squeue = "M|12|carol|RUNNING|node1|2|1|OK|local|None|0|N/A|1:00:00|1796295600|1000|wrap\n\
            M|13|carol|PENDING||4|1|OK|local|Resources|0|N/A|30:00|1796299200|1000|whole\n\
            M|14|carol|PENDING||4|1|OK|local|Priority|0|N/A|UNLIMITED|N/A|1000|later\n\
            M|15|carol|RUNNING|vm|4|1|OK|solo|None|0|N/A|1:00:00|1796295600|1000|elsewhere\n\
            M|11|root|PENDING||6|2|OK|gleaner|Priority|0|N/A|10:00|1796300000|1000|gg-mpi-00000000000beef0.0\n";
        let s = judged(SINFO, squeue, "gleaner").unwrap();
        let timing: Vec<(u32, bool, Option<u64>, Option<u64>)> = s
            .timing
            .iter()
            .map(|t| (t.slots, t.running, t.limit_ms, t.start))
            .collect();
        assert_eq!(
            timing,
            [
                (2, true, Some(3_600_000), Some(1_796_295_600_000)),
                (4, false, Some(1_800_000), Some(1_796_299_200_000)),
                (4, false, None, None),
            ],
            "a job on other nodes is not this cluster's"
        );
        let component = &s.components[0].timing;
        assert_eq!(
            (component.limit_ms, component.start),
            (Some(600_000), Some(1_796_300_000_000))
        );
    }

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
    fn placeholders_the_queue_keeps_behind_every_waiting_local_job_yield() {
        let sinfo = "node1|gleaner*|4|4/0/0/4|allocated|(null)|(null)|0|4000|1|\n\
            node1|local|4|4/0/0/4|allocated|(null)|(null)|0|4000|1|\n\
            node1|batch|4|4/0/0/4|allocated|(null)|(null)|0|4000|10|\n";
        let squeue = |small: u64| {
            format!(
                "M|20_1|root|PENDING||1|1|OK|gleaner|Priority|0|N/A|10:00|N/A|500|gl-sweep-00000000000beef0\n\
                 M|20_2|root|RUNNING|node1|1|1|OK|gleaner|None|0|N/A|10:00|N/A|500|gl-sweep-00000000000beef0\n\
                 M|21|carol|PENDING||4|1|OK|batch|Resources|0|N/A|30:00|N/A|100|wide\n\
                 M|22|carol|PENDING||1|1|OK|local|Priority|0|N/A|30:00|N/A|{small}|small\n"
            )
        };
        // A higher tier is ahead whatever its priority; in the same tier,
        // the priority decides.
        let behind = judged(sinfo, &squeue(600), "gleaner").unwrap();
        assert_eq!(behind.yielding(), BTreeSet::from(["20_1"]));
        assert_eq!(
            (behind.local_waiting(), behind.local_waiting_first()),
            (5, 4),
            "only the higher tier's job starts before any placeholder"
        );
        let level = judged(sinfo, &squeue(500), "gleaner").unwrap();
        assert!(level.yielding().is_empty(), "a tie is not behind");
        let ahead = judged(sinfo, &squeue(400), "gleaner").unwrap();
        assert!(ahead.yielding().is_empty());
        // Nothing to yield to, or an `sinfo` without tiers: none yields.
        let alone = judged(
            sinfo,
            &squeue(600).lines().take(2).collect::<Vec<_>>().join("\n"),
            "gleaner",
        )
        .unwrap();
        assert!(alone.yielding().is_empty());
        let untiered = sinfo.replace("|1|\n", "|\n").replace("|10|\n", "|\n");
        let unknown = judged(&untiered, &squeue(600), "gleaner").unwrap();
        assert!(unknown.yielding().is_empty());
        assert_eq!(unknown.local_waiting_first(), 0);
        // A stranger's job named like gleaner's, waiting, is a local job
        // like any other: behind it, a placeholder is not behind them all.
        let impostor = format!(
            "{}M|23|mallory|PENDING||1|1|OK|gleaner|Priority|0|N/A|10:00|N/A|450|gl-sweep-00000000000beef0\n",
            squeue(600)
        );
        let judged_impostor = judged(sinfo, &impostor, "gleaner").unwrap();
        assert!(judged_impostor.yielding().is_empty());
    }

    #[test]
    fn a_busy_partition() {
        let s = judged(SINFO, SQUEUE, "gleaner").unwrap();
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
        let s = snapshot(sinfo, "", "M", "gleaner", "gpu").unwrap();
        assert_eq!(s.total_slots(), 4);
        assert_eq!(s.problem.as_deref(), Some("node node1 is down*"));
    }

    #[test]
    fn unknown_partitions_and_garbage_are_errors() {
        assert!(
            snapshot(SINFO, "", "M", "nope", "gpu")
                .unwrap_err()
                .contains("no nodes")
        );
        assert!(snapshot("garbage", "", "M", "gleaner", "gpu").is_err());
        assert!(snapshot(SINFO, "M|1|root|RUNNING", "M", "gleaner", "gpu").is_err());
        assert!(
            snapshot(
                SINFO,
                "1|root|RUNNING|||1|1|OK|gleaner|None|0|N/A|x",
                "M",
                "gleaner",
                "gpu"
            )
            .is_err(),
            "lines start with the marker"
        );
    }

    #[test]
    fn memory_and_gpus_free_per_node_and_asked_by_each_job() {
        let sinfo = "node1|gleaner*|4|2/2/0/4|mixed|gpu:2|gpu:1(IDX:0)|1500|4000|\n\
            node2|gleaner*|4|0/4/0/4|idle|gpu:tesla:2(S:0-1)|gpu:tesla:0|0|4000|\n\
            node3|gleaner*|4|0/4/0/4|idle|(null)|(null)|0|4000|\n";
        let squeue = "M|7_1|root|RUNNING|node1|1|1|OK|gleaner|None|1500M|gres:gpu:1|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
            M|8|carol|PENDING||2|1|OK|gleaner|Resources|3G|gres/gpu:2,shard:1|2:00:00|N/A|1000|big\n";
        let s = snapshot(sinfo, squeue, "M", "gleaner", "gpu").unwrap();
        let free: Vec<(Option<u64>, Option<u32>)> = s
            .hosts
            .iter()
            .map(|h| (h.free_memory_mb, h.free_gpus))
            .collect();
        assert_eq!(
            free,
            [
                (Some(2500), Some(1)),
                (Some(4000), Some(2)),
                (Some(4000), Some(0))
            ]
        );
        let s = s.judge(|job| job.owner == "root");
        assert_eq!(
            s.placeholders[0].needs,
            Needs {
                memory_mb: 1500,
                gpus: 1
            }
        );
        assert_eq!(
            s.waiting[0].needs,
            Needs {
                memory_mb: 3072,
                gpus: 2
            }
        );
    }

    /// `squeue` and `sinfo` with bob's jobs named like gleaner's (a
    /// running placeholder, a held array of two, a component on two nodes
    /// and a held one), one named `odd|name`, one whose name's second line
    /// looks like a waiting placeholder of root's (job 99), and root's
    /// placeholders.
    #[test]
    fn jobs_named_like_gleaners_carry_their_owners_until_judged() {
        let sinfo = include_str!("../tests/data/sinfo-named.txt");
        let squeue = include_str!("../tests/data/squeue-named.txt");
        let s = snapshot(sinfo, squeue, "gleaner0123456789abcdef", "gleaner", "gpu").unwrap();
        assert!(s.placeholders.is_empty() && s.components.is_empty());
        let named: Vec<(&str, &str, Option<u32>, usize, bool)> = s
            .named
            .iter()
            .map(|n| {
                (
                    n.ids[0].as_str(),
                    n.owner.as_str(),
                    n.component,
                    n.hosts.len(),
                    n.waiting.is_some(),
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                ("65", "bob", Some(1), 0, false),
                ("63_1", "bob", None, 0, false),
                ("63_2", "bob", None, 0, false),
                ("62", "bob", None, 1, false),
                ("64", "bob", Some(0), 2, false),
                ("68_1", "root", None, 1, false),
                ("68_2", "root", None, 1, false),
            ],
            "held ones wait for no slots; `odd|name` and the two-line name are read whole, and are no gleaner names"
        );
        let locals = |s: &Snapshot| -> Vec<u32> { s.hosts.iter().map(|h| h.local).collect() };
        assert_eq!(locals(&s), [1, 0, 0], "only odd|name counts until judged");

        let s = s.judge(|job| job.owner == "root");
        let ids: Vec<&str> = s.placeholders.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["68_1", "68_2"], "root's only");
        assert!(s.components.is_empty() && s.waiting.is_empty());
        assert_eq!(
            locals(&s),
            [3, 1, 0],
            "bob's count where they run: a launcher and half a component on node1"
        );
        assert_eq!(s.grid_running(), 0);
    }

    #[test]
    fn someone_elses_waiting_placeholder_is_a_waiting_local_job() {
        let squeue = "M|20|bob|PENDING||4|1|OK|gleaner|Resources|0|N/A|2:00:00|N/A|1000|gl-sweep-00000000000beef0\n\
            M|21|bob|PENDING||2|2|NO|gleaner|Priority|0|N/A|2:00:00|N/A|1000|gg-mpi-00000000000beef0.0\n\
            M|22|root|PENDING||1|1|OK|gleaner|Priority|0|N/A|2:00:00|N/A|1000|gg-mpi-00000000000beef0.0\n";
        let s = judged(SINFO, squeue, "gleaner").unwrap();
        let waiting: Vec<(&str, u32, u32, bool)> = s
            .waiting
            .iter()
            .map(|w| (w.id.as_str(), w.slots, w.together, w.exclusive))
            .collect();
        assert_eq!(waiting, [("20", 4, 4, false), ("21", 2, 1, true)]);
        assert_eq!(s.components.len(), 1);
        assert_eq!(
            (s.components[0].id.as_str(), s.components[0].running),
            ("22", false)
        );
    }
}
