//! Reading Grid Engine's `qstat -f -r -xml` into a [`Snapshot`] of one
//! cluster queue, host by host, and `qconf -sp` into a parallel
//! environment's allocation rule. Pure: the commands are run elsewhere.

use std::collections::{BTreeMap, BTreeSet};

use gleaner_manifest::{Memory, Needs, Span};
use gleaner_policy::local::WaitingJob;
use serde::Deserialize;

use crate::snapshot::{Host, NamedJob, Snapshot, Timing, named_after};

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
    /// `queue@host`.
    name: String,
    #[serde(default)]
    slots_total: u32,
    /// Letters such as `a` (alarm), `u` (unknown), `E` (error), `d` (disabled).
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    job_list: Vec<JobEntry>,
    /// `qstat -F`: what is left of the host's consumables (`type="hc"`).
    #[serde(rename = "resource", default)]
    resources: Vec<Resource>,
}

/// An element like `<resource name="mem_free" type="hc">3.906G</resource>`.
#[derive(Debug, Deserialize)]
struct Resource {
    #[serde(rename = "@name", default)]
    name: String,
    #[serde(rename = "$text", default)]
    value: String,
}

/// The complexes that count memory (per slot) and GPUs (per job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumables {
    pub memory: String,
    pub gpu: String,
}

impl Consumables {
    /// `qstat -F`'s argument: the complexes to show per host.
    pub fn names(&self) -> String {
        format!("{},{}", self.memory, self.gpu)
    }
}

/// A memory value as Grid Engine prints it (`3.906G`, `1500M`, bytes).
fn memory_mb(value: &str) -> Option<u64> {
    let value = value.trim();
    match value.parse::<f64>() {
        Ok(bytes) => Some((bytes / f64::from(1 << 20)).floor() as u64),
        Err(_) => Memory::parse(value).ok().map(|m| m.0),
    }
}

/// A count as Grid Engine prints it (`2`, `2.000000`).
fn count(value: &str) -> Option<u32> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .map(|n| n.max(0.0).floor() as u32)
}

#[derive(Debug, Deserialize)]
struct JobEntry {
    #[serde(rename = "JB_job_number")]
    number: u64,
    #[serde(rename = "JB_name")]
    name: String,
    /// Who submitted it (empty if not said: then it is nobody's that
    /// gleaner would claim).
    #[serde(rename = "JB_owner", default)]
    owner: String,
    state: String,
    #[serde(default)]
    slots: u32,
    /// One task id when running; ranges like `2-8:1,10` when pending.
    #[serde(default)]
    tasks: Option<String>,
    /// `-pe NAME N` of a waiting job.
    #[serde(rename = "requested_pe", default)]
    requested_pe: Option<Named>,
    /// `-l NAME=VALUE`.
    #[serde(rename = "hard_request", default)]
    hard_requests: Vec<Named>,
    /// When it started (running), as UTC (`TZ=UTC` in qstat's
    /// environment): `2026-11-25T14:27:15`, maybe with milliseconds.
    #[serde(rename = "JAT_start_time", default)]
    start_time: Option<String>,
}

/// An element like `<requested_pe name="smp">4</requested_pe>`.
#[derive(Debug, Deserialize)]
struct Named {
    #[serde(rename = "@name", default)]
    name: String,
    #[serde(rename = "$text", default)]
    value: String,
}

impl JobEntry {
    /// Its slots and times, for estimates: `-l h_rt` is its limit.
    fn timing(&self, slots: u32, running: bool) -> Timing {
        let limit = self.hard_requests.iter().find(|r| r.name == "h_rt");
        Timing {
            slots,
            running,
            limit_ms: limit.and_then(|r| sge_duration_ms(&r.value)),
            start: self.start_time.as_deref().and_then(utc_ms),
        }
    }

    /// The memory and GPUs it asks for with `slots` slots.
    fn needs(&self, consumables: &Consumables, slots: u32) -> Needs {
        let request = |name: &str| self.hard_requests.iter().find(|r| r.name == name);
        Needs {
            memory_mb: request(&consumables.memory)
                .and_then(|r| memory_mb(&r.value))
                .map_or(0, |per_slot| per_slot.saturating_mul(u64::from(slots))),
            gpus: request(&consumables.gpu)
                .and_then(|r| count(&r.value))
                .unwrap_or(0),
        }
    }

    fn exclusive(&self) -> bool {
        self.hard_requests.iter().any(|r| {
            r.name.eq_ignore_ascii_case("exclusive")
                && matches!(r.value.trim().to_ascii_lowercase().as_str(), "true" | "1")
        })
    }
}

/// How a parallel environment spreads a job's slots over hosts
/// (`allocation_rule` in `qconf -sp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationRule {
    /// `$pe_slots`: every slot on one host.
    OneHost,
    /// A number: that many slots on each host.
    PerHost(u32),
    /// `$round_robin`, `$fill_up`: any slots on any hosts.
    Spread,
}

/// The allocation rule in `qconf -sp NAME`'s output.
pub fn allocation_rule(qconf_sp: &str) -> Option<AllocationRule> {
    let value = qconf_sp.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("allocation_rule")).then(|| words.next())?
    })?;
    Some(match value {
        "$pe_slots" => AllocationRule::OneHost,
        "$round_robin" | "$fill_up" => AllocationRule::Spread,
        n => AllocationRule::PerHost(n.parse().ok().filter(|n| *n > 0)?),
    })
}

/// `qstat -f -r -xml` read, before the allocation rules it names are known.
#[derive(Debug)]
pub struct Qstat(Root);

/// Reads `qstat -f -r -xml -q <queue> -u '*'`. `Err` says what was wrong.
pub fn read(xml: &str) -> Result<Qstat, String> {
    quick_xml::de::from_str(xml)
        .map(Qstat)
        .map_err(|e| format!("unreadable qstat XML: {e}"))
}

impl Qstat {
    /// The parallel environments waiting jobs ask for.
    pub fn requested_pes(&self) -> BTreeSet<&str> {
        self.0
            .job_info
            .job_list
            .iter()
            .filter_map(|job| job.requested_pe.as_ref())
            .map(|pe| pe.name.as_str())
            .collect()
    }

    /// The cluster's snapshot, reading waiting jobs' parallel environments
    /// by `rules` (one it does not know counts as spread). Jobs named like
    /// gleaner's are left [`NamedJob`], with their owners (`JB_owner`), for
    /// the kcm's core to judge: each with what it is as someone else's
    /// too, a waiting local job unless it is on hold or in error.
    pub fn snapshot(
        &self,
        queue: &str,
        rules: &BTreeMap<String, AllocationRule>,
        consumables: &Consumables,
    ) -> Result<Snapshot, String> {
        let root = &self.0;
        let instance_prefix = format!("{queue}@");
        let mut snapshot = Snapshot::default();
        let mut problems = Vec::new();
        // Where in `snapshot.named` each running job is, by batch id.
        let mut running: BTreeMap<String, usize> = BTreeMap::new();
        // Where in `snapshot.timing` each running local job is.
        let mut local_running: BTreeMap<String, usize> = BTreeMap::new();
        for instance in &root.queue_info.queues {
            let Some(host_name) = instance.name.strip_prefix(&instance_prefix) else {
                continue;
            };
            let state = instance.state.as_deref().unwrap_or("");
            let usable = !state.contains(UNUSABLE);
            if !usable {
                problems.push(format!("{} is in state {state}", instance.name));
            }
            let mut host = Host::new(host_name, if usable { instance.slots_total } else { 0 });
            // `-F` shows the value that limits a resource: what is left of
            // a host's or a queue's consumable (`hc`, `qc`), or the host's
            // measured value (`hl`) when lower.
            let left = |name: &str| -> Vec<&str> {
                instance
                    .resources
                    .iter()
                    .filter(|r| r.name == name)
                    .map(|r| r.value.as_str())
                    .collect()
            };
            host.free_memory_mb = left(&consumables.memory)
                .into_iter()
                .filter_map(memory_mb)
                .min();
            host.free_gpus = left(&consumables.gpu).into_iter().filter_map(count).min();
            for job in &instance.job_list {
                let id = match &job.tasks {
                    Some(task) => format!("{}.{task}", job.number),
                    None => job.number.to_string(),
                };
                let Some((named, component)) = named_after(&job.name) else {
                    host.local = host.local.saturating_add(job.slots);
                    // A job on many hosts is one job with their slots.
                    let at = *local_running.entry(id).or_insert_with(|| {
                        snapshot.timing.push(job.timing(0, true));
                        snapshot.timing.len() - 1
                    });
                    if let Some(timing) = snapshot.timing.get_mut(at) {
                        timing.slots = timing.slots.saturating_add(job.slots);
                    }
                    continue;
                };
                let here = (host_name.to_owned(), job.slots);
                let needs = job.needs(consumables, job.slots);
                // A job on many hosts is one job with their slots.
                match running.get(&id).and_then(|&i| snapshot.named.get_mut(i)) {
                    Some(run) => {
                        run.slots = run.slots.saturating_add(job.slots);
                        run.timing.slots = run.slots;
                        run.needs.memory_mb = run.needs.memory_mb.saturating_add(needs.memory_mb);
                        run.hosts.push(here);
                    }
                    None => {
                        running.insert(id.clone(), snapshot.named.len());
                        snapshot.named.push(NamedJob {
                            job: named,
                            component,
                            owner: job.owner.clone(),
                            ids: vec![id],
                            slots: job.slots.max(1),
                            hosts: vec![here],
                            waiting: None,
                            problem: None,
                            needs,
                            timing: job.timing(job.slots.max(1), true),
                        });
                    }
                }
            }
            snapshot.hosts.push(host);
        }
        if snapshot.hosts.is_empty() {
            return Err(format!("no queue {queue} in the batch system"));
        }
        let largest_host = snapshot.hosts.iter().map(|h| h.slots).max().unwrap_or(0);
        for job in &root.job_info.job_list {
            let tasks = match &job.tasks {
                Some(ranges) => expand_tasks(ranges),
                None => vec![None],
            };
            // A job on hold, or in error, is not waiting for slots.
            let waiting = (!job.state.contains(['h', 'E'])).then(|| {
                waiting_job(
                    job,
                    tasks.len() as u32,
                    snapshot.total_slots().max(1),
                    largest_host,
                    rules,
                    consumables,
                )
            });
            let Some((named, component)) = named_after(&job.name) else {
                if let Some(waiting) = waiting {
                    snapshot.timing.push(job.timing(waiting.slots, false));
                    snapshot.waiting.push(waiting);
                }
                continue;
            };
            let (ids, problem) = match component {
                Some(_) => (vec![job.number.to_string()], None),
                None => (
                    tasks
                        .iter()
                        .map(|task| match task {
                            Some(task) => format!("{}.{task}", job.number),
                            None => job.number.to_string(),
                        })
                        .collect(),
                    job.state.contains('E').then(|| {
                        format!(
                            "placeholder job {} is in error state {}",
                            job.number, job.state
                        )
                    }),
                ),
            };
            snapshot.named.push(NamedJob {
                job: named,
                component,
                owner: job.owner.clone(),
                ids,
                slots: job.slots.max(1),
                hosts: Vec::new(),
                waiting,
                problem,
                needs: job.needs(consumables, job.slots.max(1)),
                timing: job.timing(job.slots.max(1), false),
            });
        }
        snapshot.problem = (!problems.is_empty()).then(|| problems.join("; "));
        Ok(snapshot)
    }
}

/// A waiting local job: its slots (a pending array's tasks together, at
/// most the whole queue) and which of them must share a host.
fn waiting_job(
    job: &JobEntry,
    tasks: u32,
    total_slots: u32,
    largest_host: u32,
    rules: &BTreeMap<String, AllocationRule>,
    consumables: &Consumables,
) -> WaitingJob {
    let each = job.slots.max(1);
    let together = match job.requested_pe.as_ref().and_then(|pe| rules.get(&pe.name)) {
        Some(AllocationRule::OneHost) => each,
        Some(AllocationRule::PerHost(n)) => (*n).min(each),
        Some(AllocationRule::Spread) | None => 1,
    };
    // Each task of an array is its own job: its slots stay together.
    let copies = tasks.min(total_slots.div_ceil(each).max(1));
    let exclusive = job.exclusive();
    let needs = job.needs(consumables, each).times(copies);
    WaitingJob {
        needs,
        id: job.number.to_string(),
        slots: each.saturating_mul(copies),
        together: if exclusive {
            together.max(each.min(largest_host))
        } else {
            together
        },
        exclusive,
    }
}

/// A time as Grid Engine takes one: seconds, or `[[h:]m:]s`.
fn sge_duration_ms(text: &str) -> Option<u64> {
    let seconds = text.trim().split(':').try_fold(0u64, |sum, part| {
        sum.checked_mul(60)?.checked_add(part.parse::<u64>().ok()?)
    })?;
    seconds.checked_mul(1000)
}

/// `2026-11-25T14:27:15` or `2026-11-25T14:27:15.123`, UTC, as ms since
/// the epoch.
fn utc_ms(text: &str) -> Option<u64> {
    let (date, time) = text.trim().split_once('T')?;
    let mut date = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (time, millis) = match time.split_once('.') {
        Some((time, fraction)) => (
            time,
            format!("{fraction:0<3}").get(..3)?.parse::<u64>().ok()?,
        ),
        None => (time, 0),
    };
    let mut time = time.split(':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (time.next()??, time.next()??, time.next()??);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(seconds)
        .ok()?
        .checked_mul(1000)?
        .checked_add(millis)
}

/// Queue instance states in which it runs nothing new.
const UNUSABLE: &[char] = &['a', 'u', 'E', 'd', 's', 'S', 'D', 'C', 'o'];

/// `2-8:2,10` → 2, 4, 6, 8, 10. Bounded: a pending array of a million tasks
/// is not a million placeholders to look at.
fn expand_tasks(ranges: &str) -> Vec<Option<u64>> {
    const LIMIT: usize = 100_000;
    let mut tasks: Vec<Option<u64>> = Span::list(ranges)
        .filter_map(Result::ok)
        .flat_map(Span::numbers)
        .take(LIMIT)
        .map(Some)
        .collect();
    if tasks.is_empty() {
        tasks.push(None);
    }
    tasks
}

#[cfg(test)]
mod tests;
