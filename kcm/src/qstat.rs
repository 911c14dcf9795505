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
mod tests {
    use super::*;

    /// The snapshot as read, its jobs named like gleaner's not judged.
    fn unjudged(xml: &str, queue: &str) -> Result<Snapshot, String> {
        let rules = [
            ("smp".to_owned(), AllocationRule::OneHost),
            ("make".to_owned(), AllocationRule::Spread),
            ("two".to_owned(), AllocationRule::PerHost(2)),
        ]
        .into();
        let consumables = Consumables {
            memory: "mem_free".into(),
            gpu: "gpu".into(),
        };
        read(xml)?.snapshot(queue, &rules, &consumables)
    }

    /// The snapshot as a kcm running as root with one user judges it.
    fn snapshot(xml: &str, queue: &str) -> Result<Snapshot, String> {
        unjudged(xml, queue).map(|s| s.judge(|job| job.owner == "root"))
    }

    const SAMPLE: &str = include_str!("../tests/data/qstat-c1.xml");

    #[test]
    fn the_real_output_of_a_busy_queue() {
        let s = snapshot(SAMPLE, "c1.q").unwrap();
        assert_eq!(s.total_slots(), 8);
        let running: Vec<&str> = s
            .placeholders
            .iter()
            .filter(|p| p.running())
            .map(|p| p.id.as_str())
            .collect();
        assert_eq!(
            running,
            ["3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7", "3.8"]
        );
        let pending: Vec<&str> = s
            .placeholders
            .iter()
            .filter(|p| !p.running())
            .map(|p| p.id.as_str())
            .collect();
        assert_eq!(pending, ["3.9", "3.10"]);
        assert!(
            s.placeholders
                .iter()
                .all(|p| p.job.as_str() == "sweep-3fa9c2d41e07b5a8")
        );
        assert_eq!(s.local_running(), 0);
        assert_eq!(
            s.waiting,
            [WaitingJob::anywhere("4", 2)],
            "the held job does not wait for slots"
        );
        assert_eq!(s.problem, None);
    }

    /// Bob's jobs named like gleaner's in a 4-slot queue (a running
    /// placeholder, a held array of three, a running component of two
    /// slots, a held one) beside root's array of two placeholders.
    #[test]
    fn the_real_output_of_jobs_named_like_gleaners() {
        let xml = include_str!("../tests/data/qstat-named.xml");
        let s = unjudged(xml, "c1.q").unwrap();
        assert!(s.placeholders.is_empty() && s.components.is_empty());
        assert_eq!((s.local_running(), s.grid_running()), (0, 0));
        let named: Vec<(Vec<&str>, &str, Option<u32>, usize)> = s
            .named
            .iter()
            .map(|n| {
                (
                    n.ids.iter().map(String::as_str).collect(),
                    n.owner.as_str(),
                    n.component,
                    n.hosts.len(),
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                (vec!["9"], "bob", None, 1),
                (vec!["11"], "bob", Some(0), 1),
                (vec!["13.1"], "root", None, 1),
                (vec!["13.2"], "root", None, 0),
                (vec!["10.1", "10.2", "10.3"], "bob", None, 0),
                (vec!["12"], "bob", Some(1), 0),
            ]
        );
        assert_eq!(
            s.named[3].waiting,
            Some(WaitingJob::anywhere("13", 1)),
            "were it anybody else's, it would be a waiting local job"
        );
        assert!(
            s.named[4..].iter().all(|n| n.waiting.is_none()),
            "held ones wait for nothing"
        );

        let s = s.judge(|job| job.owner == "root");
        let ids: Vec<(&str, bool)> = s
            .placeholders
            .iter()
            .map(|p| (p.id.as_str(), p.running()))
            .collect();
        assert_eq!(ids, [("13.1", true), ("13.2", false)]);
        assert!(s.components.is_empty() && s.waiting.is_empty());
        assert_eq!(
            (s.local_running(), s.grid_running()),
            (3, 0),
            "bob's placeholder and component are his local jobs"
        );
        assert_eq!(s.idle_slots(), 0, "3 local, 1 held, 1 claimed");
    }

    #[test]
    fn someone_elses_named_jobs_are_local_and_report_nothing() {
        let xml = r#"<job_info><queue_info>
            <Queue-List><name>g1.q@n1</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>bob</JB_owner><state>r</state><slots>1</slots></job_list>
            </Queue-List>
            <Queue-List><name>g1.q@n2</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>bob</JB_owner><state>r</state><slots>3</slots></job_list>
            </Queue-List></queue_info>
            <job_info>
              <job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>bob</JB_owner><state>qw</state><slots>2</slots><tasks>1-3:1</tasks>
                <requested_pe name="smp">2</requested_pe></job_list>
              <job_list state="pending"><JB_job_number>7</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>bob</JB_owner><state>Eqw</state><slots>1</slots></job_list>
              <job_list state="pending"><JB_job_number>8</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>root</JB_owner><state>Eqw</state><slots>1</slots></job_list>
              <job_list state="pending"><JB_job_number>9</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><state>qw</state><slots>1</slots></job_list>
            </job_info></job_info>"#;
        let s = snapshot(xml, "g1.q").unwrap();
        let hosts: Vec<(u32, u32)> = s.hosts.iter().map(|h| (h.local, h.grid)).collect();
        assert_eq!(hosts, [(1, 0), (3, 0)], "bob's component, where it runs");
        let ids: Vec<&str> = s.placeholders.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["8"], "root's alone; one without an owner is nobody's");
        let waiting: Vec<(&str, u32, u32)> = s
            .waiting
            .iter()
            .map(|w| (w.id.as_str(), w.slots, w.together))
            .collect();
        assert_eq!(
            waiting,
            [("6", 6, 2), ("9", 1, 1)],
            "bob's array waits as his; his job in error does not"
        );
        assert_eq!(
            s.problem.as_deref(),
            Some("placeholder job 8 is in error state Eqw"),
            "only gleaner's own placeholders' errors are reported"
        );
    }

    #[test]
    fn grid_components_are_neither_local_nor_placeholders() {
        let xml = r#"<job_info><queue_info><Queue-List><name>c1.q@a</name><slots_total>8</slots_total>
            <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>4</slots></job_list>
            </Queue-List></queue_info>
            <job_info><job_list state="pending"><JB_job_number>6</JB_job_number><JB_name>gg-mpi-00000000000beef0.1</JB_name><JB_owner>root</JB_owner><state>qw</state><slots>2</slots></job_list></job_info></job_info>"#;
        let s = snapshot(xml, "c1.q").unwrap();
        assert_eq!((s.grid_running(), s.local_running()), (4, 0));
        assert!(s.waiting.is_empty() && s.placeholders.is_empty());
        assert_eq!(s.components.len(), 2);
        assert_eq!(
            (s.components[1].component, s.components[1].running),
            (1, false)
        );
    }

    #[test]
    fn memory_and_gpus_left_per_host_and_asked_by_each_job() {
        let xml = r#"<?xml version='1.0'?><job_info><queue_info>
            <Queue-List><name>g1.q@node3</name><slots_total>4</slots_total>
              <resource name="mem_free" type="hc">2.441G</resource>
              <resource name="gpu" type="hc">1</resource>
              <resource name="gpu" type="qc">3</resource>
              <job_list state="running"><JB_job_number>71</JB_job_number><JB_name>gl-gpus-0123456789abcdef</JB_name>
                <JB_owner>root</JB_owner><state>r</state><slots>2</slots><tasks>3</tasks>
                <hard_request name="mem_free" resource_contribution="0.000000">750M</hard_request>
                <hard_request name="gpu" resource_contribution="0.000000">1</hard_request></job_list>
            </Queue-List>
            <Queue-List><name>g1.q@node4</name><slots_total>4</slots_total></Queue-List>
            </queue_info><job_info>
              <job_list state="pending"><JB_job_number>72</JB_job_number><JB_name>big</JB_name>
                <JB_owner>bob</JB_owner><state>qw</state><slots>2</slots>
                <requested_pe name="smp">2</requested_pe>
                <hard_request name="mem_free" resource_contribution="0.000000">1.5G</hard_request>
                <hard_request name="gpu" resource_contribution="0.000000">2</hard_request></job_list>
            </job_info></job_info>"#;
        let snapshot = snapshot(xml, "g1.q").unwrap();
        let node3 = &snapshot.hosts[0];
        assert_eq!(
            (node3.free_memory_mb, node3.free_gpus),
            (Some(2500), Some(1))
        );
        let node4 = &snapshot.hosts[1];
        assert_eq!(
            (node4.free_memory_mb, node4.free_gpus),
            (None, None),
            "not counted"
        );
        assert_eq!(
            snapshot.placeholders[0].needs,
            Needs {
                memory_mb: 1500,
                gpus: 1
            },
            "memory per slot, GPUs per job"
        );
        assert_eq!(
            snapshot.waiting[0].needs,
            Needs {
                memory_mb: 3072,
                gpus: 2
            }
        );
    }

    #[test]
    fn hosts_of_a_real_multi_host_queue() {
        // A local `-pe make 6` on 2 slots of each of 3 hosts, and a
        // `-pe smp 5` that no 4-slot host can take.
        let s = snapshot(include_str!("../tests/data/qstat-g1.xml"), "g1.q").unwrap();
        let hosts: Vec<(&str, u32, u32)> = s
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), h.slots, h.local))
            .collect();
        assert_eq!(hosts, [("node1", 4, 2), ("node2", 4, 2), ("node3", 4, 2)]);
        assert_eq!(s.waiting, [WaitingJob::one_host("16", 5)]);
    }

    #[test]
    fn placeholders_and_components_know_their_hosts() {
        let xml = r#"<job_info><queue_info>
            <Queue-List><name>g1.q@n1</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>2</slots></job_list>
              <job_list state="running"><JB_job_number>7</JB_job_number><JB_name>gl-sweep-00000000000beef0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>2</slots><tasks>1</tasks></job_list>
            </Queue-List>
            <Queue-List><name>g1.q@n2</name><slots_total>4</slots_total>
              <job_list state="running"><JB_job_number>5</JB_job_number><JB_name>gg-mpi-00000000000beef0.0</JB_name><JB_owner>root</JB_owner><state>r</state><slots>4</slots></job_list>
            </Queue-List></queue_info>
            <job_info>
              <job_list state="pending"><JB_job_number>8</JB_job_number><JB_name>whole</JB_name><state>qw</state><slots>1</slots>
                <hard_request name="exclusive" resource_contribution="0.0">true</hard_request></job_list>
              <job_list state="pending"><JB_job_number>9</JB_job_number><JB_name>pairs</JB_name><state>qw</state><slots>4</slots>
                <requested_pe name="two">4</requested_pe></job_list>
              <job_list state="pending"><JB_job_number>10</JB_job_number><JB_name>odd</JB_name><state>qw</state><slots>3</slots>
                <requested_pe name="unknown">3</requested_pe></job_list>
            </job_info></job_info>"#;
        let s = snapshot(xml, "g1.q").unwrap();
        assert_eq!(s.placeholders[0].host.as_deref(), Some("n1"));
        assert_eq!((s.components.len(), s.components[0].slots), (1, 6));
        assert_eq!((s.hosts[0].grid, s.hosts[1].grid), (2, 4));
        let shapes: Vec<(u32, u32, bool)> = s
            .waiting
            .iter()
            .map(|w| (w.slots, w.together, w.exclusive))
            .collect();
        assert_eq!(shapes, [(1, 1, true), (4, 2, false), (3, 1, false)]);
        assert_eq!(
            read(xml).unwrap().requested_pes(),
            ["two", "unknown"].into()
        );
    }

    #[test]
    fn allocation_rules_read_from_qconf() {
        let pe = |rule: &str| {
            allocation_rule(&format!(
                "pe_name smp\nslots 999\nallocation_rule {rule}\ncontrol_slaves FALSE\n"
            ))
        };
        assert_eq!(pe("$pe_slots"), Some(AllocationRule::OneHost));
        assert_eq!(pe("$round_robin"), Some(AllocationRule::Spread));
        assert_eq!(pe("$fill_up"), Some(AllocationRule::Spread));
        assert_eq!(pe("4"), Some(AllocationRule::PerHost(4)));
        assert_eq!(pe("0"), None);
        assert_eq!(allocation_rule("error: no such PE"), None);
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
    fn start_times_and_limits_are_read_as_utc_and_seconds() {
        assert_eq!(utc_ms("1970-01-01T00:00:00"), Some(0));
        assert_eq!(utc_ms("2026-11-25T14:27:15"), Some(1_795_616_835_000));
        assert_eq!(utc_ms("2000-02-29T23:59:59.5"), Some(951_868_799_500));
        for bad in [
            "2026-13-01T00:00:00",
            "2026-11-25",
            "2026-11-25T25:00:00",
            "x",
        ] {
            assert_eq!(utc_ms(bad), None, "{bad}");
        }
        assert_eq!(sge_duration_ms("1800"), Some(1_800_000));
        assert_eq!(sge_duration_ms("1:00:00"), Some(3_600_000));
        assert_eq!(sge_duration_ms("INFINITY"), None);
        // The real output's running placeholder started then.
        let snapshot = unjudged(include_str!("../tests/data/qstat-named.xml"), "c1.q");
        let started: Vec<Option<u64>> = snapshot
            .unwrap()
            .named
            .iter()
            .filter(|n| !n.hosts.is_empty())
            .map(|n| n.timing.start)
            .collect();
        assert!(started.contains(&Some(1_795_616_835_000)), "{started:?}");
    }

    #[test]
    fn broken_queues_and_output_are_reported() {
        let xml = r#"<?xml version='1.0'?><job_info><queue_info><Queue-List><name>c1.q@vm</name><slots_used>0</slots_used><slots_total>8</slots_total><state>E</state></Queue-List></queue_info><job_info></job_info></job_info>"#;
        let s = snapshot(xml, "c1.q").unwrap();
        assert_eq!(s.total_slots(), 0);
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
        assert_eq!((s.total_slots(), s.local_running()), (8, 2));
        assert_eq!(
            s.waiting[0].slots, 8,
            "a pending array wants at most the whole queue"
        );
    }
}
