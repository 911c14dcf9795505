//! Workloads of parallel machines, for the simulated clusters' own users:
//! logs of the Parallel Workloads Archive in its Standard Workload Format
//! (SWF), and synthetic ones after Lublin & Feitelson's model, with the
//! walltime requests real users make.

use std::ops::RangeInclusive;

use rand::{Rng, RngExt};

/// One job of a workload, in seconds from the workload's start.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadJob {
    /// SWF field 1.
    pub id: u64,
    /// SWF field 2.
    pub submit_s: f64,
    /// SWF field 4: how long it runs if its walltime does not stop it.
    pub run_s: f64,
    /// SWF field 5 (allocated processors), else field 8 (requested) when
    /// field 5 is -1.
    pub procs: u32,
    /// SWF field 9, or `run_s` when the log has none. It may be below
    /// `run_s`: what happens to such a job is the simulator's to decide.
    pub requested_s: f64,
    /// SWF field 12, `None` when -1.
    pub user: Option<u32>,
}

/// A workload log.
#[derive(Debug, Clone, PartialEq)]
pub struct Swf {
    /// The machine's size from the header's `MaxProcs`, else `MaxNodes`.
    pub max_procs: Option<u32>,
    /// Its usable jobs, by submit time.
    pub jobs: Vec<WorkloadJob>,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    #[error("{0}")]
    Invalid(String),
}

/// The most jobs a workload may have, whatever its input says: bounds the
/// memory a log or a configuration can make us take.
pub const MAX_JOBS: usize = 10_000_000;

/// The SWF's fields, in order, for error messages.
const FIELDS: [&str; 18] = [
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable",
    "queue",
    "partition",
    "preceding job",
    "think time",
];

/// The SWF's mark of a value the log does not have.
const MISSING: f64 = -1.0;

/// Reads an SWF log, as hostile input: a malformed line is an error that
/// names it (1-based), so that a bad log is fixed rather than half used.
///
/// Jobs the archive marks unusable are skipped: those that never ran
/// (runtime -1, as jobs cancelled while waiting, status 5, have) and those
/// with no processors (0, or -1 in both fields 5 and 8). A line must have
/// exactly 18 fields, all finite numbers.
pub fn parse_swf(text: &str) -> Result<Swf, WorkloadError> {
    let mut max_procs = None;
    let mut max_nodes = None;
    let mut jobs = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let malformed = move |reason: String| WorkloadError::Malformed { line, reason };
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix(';') {
            if let Some((key, value)) = comment.split_once(':') {
                let key = key.trim();
                if key.eq_ignore_ascii_case("MaxProcs") {
                    max_procs = header_count(value).map_err(malformed)?;
                } else if key.eq_ignore_ascii_case("MaxNodes") {
                    max_nodes = header_count(value).map_err(malformed)?;
                }
            }
            continue;
        }
        if let Some(job) = parse_job(trimmed).map_err(malformed)? {
            if jobs.len() == MAX_JOBS {
                return Err(malformed(format!("more than {MAX_JOBS} jobs")));
            }
            jobs.push(job);
        }
    }
    // Logs are in submit order, but not all: the simulator needs it.
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    Ok(Swf {
        max_procs: max_procs.or(max_nodes),
        jobs,
    })
}

/// A header's machine size; none when the log says it does not know
/// (nothing, 0 or -1).
fn header_count(value: &str) -> Result<Option<u32>, String> {
    let Some(token) = value.split_whitespace().next() else {
        return Ok(None);
    };
    let number: i64 = token
        .parse()
        .map_err(|_| format!("header count `{token}` is not an integer"))?;
    if number <= 0 {
        return Ok(None);
    }
    u32::try_from(number)
        .map(Some)
        .map_err(|_| format!("header count {number} is too large"))
}

/// One job line; `None` for a job the archive marks unusable.
fn parse_job(line: &str) -> Result<Option<WorkloadJob>, String> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    if tokens.len() != FIELDS.len() {
        return Err(format!(
            "expected {} fields, found {}",
            FIELDS.len(),
            tokens.len()
        ));
    }
    let values = tokens
        .iter()
        .zip(FIELDS)
        .enumerate()
        .map(|(i, (token, name))| {
            token
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    format!("field {} ({name}): `{token}` is not a finite number", i + 1)
                })
        })
        .collect::<Result<Vec<f64>, String>>()?;
    let field = |n: usize| values[n - 1];
    let id = tokens[0]
        .parse::<u64>()
        .map_err(|_| format!("field 1 (job number): `{}` is not a job number", tokens[0]))?;
    let submit_s = field(2);
    if submit_s < 0.0 {
        return Err(format!("field 2 (submit time): {submit_s} is negative"));
    }
    let run_s = field(4);
    if run_s == MISSING {
        return Ok(None);
    }
    if run_s < 0.0 {
        return Err(format!("field 4 (run time): {run_s} is negative"));
    }
    let procs = if field(5) == MISSING {
        field(8)
    } else {
        field(5)
    };
    if procs == MISSING || procs == 0.0 {
        return Ok(None);
    }
    let procs = count(procs).ok_or_else(|| {
        format!("fields 5 and 8 (processors): {procs} is not a number of processors")
    })?;
    let requested = field(9);
    if requested < 0.0 && requested != MISSING {
        return Err(format!("field 9 (requested time): {requested} is negative"));
    }
    let requested_s = if requested == MISSING {
        run_s
    } else {
        requested
    };
    let user = field(12);
    let user = if user == MISSING {
        None
    } else {
        Some(count(user).ok_or_else(|| format!("field 12 (user id): {user} is not a user id"))?)
    };
    Ok(Some(WorkloadJob {
        id,
        submit_s,
        run_s,
        procs,
        requested_s,
        user,
    }))
}

/// A whole, non-negative number that fits a `u32`.
fn count(v: f64) -> Option<u32> {
    (v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&v)).then_some(v as u32)
}

/// Writes jobs as an SWF log that [`parse_swf`] reads back as they were:
/// the fields it does not keep are -1 (status too: these jobs have not
/// run), field 8 repeats the processors. Times are written exactly, as
/// integers when whole (the generator's are); they must be finite.
pub fn to_swf(jobs: &[WorkloadJob], max_procs: u32) -> String {
    let header = [
        "; Version: 2.2".to_string(),
        "; Note: written by gleaner-simulator; unused fields are -1".to_string(),
        format!("; MaxJobs: {}", jobs.len()),
        format!("; MaxRecords: {}", jobs.len()),
        format!("; MaxProcs: {max_procs}"),
        format!("; MaxNodes: {max_procs}"),
    ];
    let mut lines = Vec::from(header);
    lines.extend(jobs.iter().map(swf_line));
    lines.push(String::new());
    lines.join("\n")
}

fn swf_line(job: &WorkloadJob) -> String {
    format!(
        "{} {} -1 {} {} -1 -1 {} {} -1 -1 {} -1 -1 -1 -1 -1 -1",
        job.id,
        job.submit_s,
        job.run_s,
        job.procs,
        job.procs,
        job.requested_s,
        job.user.map_or(-1, i64::from),
    )
}

// Lublin & Feitelson, "The workload on parallel supercomputers: modeling
// the characteristics of rigid jobs" (JPDC 63(11), 2003), with the
// single-class ("whole sample") parameters of their m_lublin99.c. That
// program mixes batch and interactive classes by default, each with its
// own parameters; one class keeps the model to the constants below.

/// Share of serial jobs.
const SERIAL_PROB: f64 = 0.244;
/// Share of jobs whose size is a power of two: of all jobs, so about 0.76
/// of the parallel ones.
const POW2_PROB: f64 = 0.576;
/// log2 of the smallest parallel size; below 1 so that 2 is a little less
/// likely than a uniform draw would make it.
const ULOW: f64 = 0.8;
/// How far below UHI (log2 of the machine's size) the two-stage uniform
/// breaks: UMED = UHI - 2.5, 4.5 for the model's 128 nodes.
const UMED_BELOW_UHI: f64 = 2.5;
/// Share of parallel sizes drawn in [ULOW, UMED] rather than [UMED, UHI].
const UPROB: f64 = 0.86;
/// The hyper-gamma of log-runtimes: gamma(A1, B1) for short jobs...
const A1: f64 = 4.2;
const B1: f64 = 0.94;
/// ... and gamma(A2, B2) for long ones...
const A2: f64 = 312.0;
const B2: f64 = 0.03;
/// ... the short one with probability PA * nodes + PB, so that larger
/// jobs run longer. The program takes the number of nodes here, not its
/// log2.
const PA: f64 = -0.0054;
const PB: f64 = 0.78;
/// The model draws again above this log-runtime: e^12 s, about 45 hours.
const MAX_LOG_RUN: f64 = 12.0;
/// Log inter-arrival times in rush hours are gamma(AARR * ARAR, BARR):
/// ARAR stretches the rush hours' fit over the whole day.
const AARR: f64 = 10.2303;
const BARR: f64 = 0.4871;
const ARAR: f64 = 1.0225;
/// The daily cycle: the share of arrivals in a half hour follows a
/// gamma(ANUM, BNUM) density over the model's day of half hours.
const ANUM: f64 = 8.1737;
const BNUM: f64 = 3.9631;
/// The model draws again above this log inter-arrival time: e^13 s, about
/// 5 days.
const MAX_LOG_GAP: f64 = 13.0;
/// Half hours in a day.
const BUCKETS: usize = 48;
const BUCKET_S: f64 = 1800.0;
/// The model's day starts at this half hour and wraps over midnight.
const CYCLE_START: usize = 11;

const MINUTE: f64 = 60.0;
const HOUR: f64 = 3600.0;
const LONGEST_S: f64 = 48.0 * HOUR;
/// The walltimes users ask for most (Tsafrir, Etsion & Feitelson, 2005).
const POPULAR_S: [f64; 13] = [
    5.0 * MINUTE,
    10.0 * MINUTE,
    15.0 * MINUTE,
    30.0 * MINUTE,
    HOUR,
    2.0 * HOUR,
    4.0 * HOUR,
    8.0 * HOUR,
    12.0 * HOUR,
    18.0 * HOUR,
    24.0 * HOUR,
    36.0 * HOUR,
    LONGEST_S,
];

/// Load scales [`lublin`] takes as they are; it clamps others, so that no
/// configuration makes it loop for ever.
const LOAD_SCALES: RangeInclusive<f64> = 0.01..=100.0;

/// A synthetic workload after Lublin & Feitelson (JPDC 2003).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lublin {
    /// How many jobs.
    pub jobs: usize,
    /// The machine's size: the largest job, and the model's UHI as log2.
    pub max_nodes: u32,
    /// Divides inter-arrival times: above 1, a busier workload.
    #[serde(default = "one")]
    pub load_scale: f64,
    /// Share of jobs whose walltime request is below their runtime.
    #[serde(default = "tenth")]
    pub underestimated: f64,
}

fn one() -> f64 {
    1.0
}

fn tenth() -> f64 {
    0.1
}

impl Lublin {
    /// Whether [`lublin`] takes the parameters as they are; it brings
    /// others into range, so call this on configurations.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let invalid = |m: String| Err(WorkloadError::Invalid(m));
        if !(1..=MAX_JOBS).contains(&self.jobs) {
            return invalid(format!("a workload has 1 to {MAX_JOBS} jobs"));
        }
        if self.max_nodes == 0 {
            return invalid("a workload's machine has at least one node".into());
        }
        if !LOAD_SCALES.contains(&self.load_scale) {
            return invalid(format!(
                "load_scale must be in {}..={}",
                LOAD_SCALES.start(),
                LOAD_SCALES.end()
            ));
        }
        if !(0.0..=1.0).contains(&self.underestimated) {
            return invalid("underestimated is a share, in 0..=1".into());
        }
        Ok(())
    }
}

/// A workload after Lublin & Feitelson's model: ids from 1, by submit
/// time (whole seconds from midnight of the first day), sizes from 1 to
/// `max_nodes`, whole runtimes of at least 1 s.
///
/// Sizes, runtimes and arrivals are the model's; walltime requests are
/// popular values above the runtime, but for the `underestimated` share of
/// jobs, whose requests are below. Parameters out of [`Lublin::check`]'s
/// ranges are brought into them (a NaN as its default).
///
/// With 128 nodes the jobs are about a quarter serial, mostly powers of
/// two otherwise, half of them shorter than about 110 s, and arrive about
/// 940 s apart on average, most in working hours: a load near 0.7.
pub fn lublin(params: &Lublin, rng: &mut impl Rng) -> Vec<WorkloadJob> {
    let total = params.jobs.min(MAX_JOBS);
    let max_nodes = params.max_nodes.max(1);
    let uhi = f64::from(max_nodes).log2();
    let mut arrivals = Arrivals::new(sane(params.load_scale, LOAD_SCALES, one()));
    let mut t = arrivals.gap(rng);
    let mut jobs = Vec::with_capacity(total);
    for id in 1..=total as u64 {
        let submit_s = t.floor();
        t += arrivals.gap(rng);
        let procs = size(rng, uhi, max_nodes);
        let run_s = runtime(rng, procs);
        jobs.push(WorkloadJob {
            id,
            submit_s,
            run_s,
            procs,
            requested_s: requested(rng, run_s),
            user: None,
        });
    }
    let share = sane(params.underestimated, 0.0..=1.0, tenth());
    underestimate(&mut jobs, share, rng);
    jobs
}

/// `value` brought into `range`, NaN (which no range holds) as `otherwise`.
fn sane(value: f64, range: RangeInclusive<f64>, otherwise: f64) -> f64 {
    if value.is_nan() {
        otherwise
    } else {
        value.clamp(*range.start(), *range.end())
    }
}

/// The model's job size: serial, or 2 to the power of a two-stage uniform
/// draw, rounded to an integer exponent for the power-of-two share.
fn size<R: Rng>(rng: &mut R, uhi: f64, max_nodes: u32) -> u32 {
    let u = unit(rng);
    if u < SERIAL_PROB {
        return 1;
    }
    // On small machines UHI - 2.5 falls below ULOW: the model's authors
    // then move UMED up, here to the middle of [ULOW, UHI].
    let umed = (uhi - UMED_BELOW_UHI).max(f64::midpoint(ULOW, uhi));
    let (low, high) = if unit(rng) < UPROB {
        (ULOW, umed)
    } else {
        (umed, uhi)
    };
    let log2 = low + (high - low) * unit(rng);
    let nodes = if u < SERIAL_PROB + POW2_PROB {
        let exponent = log2.round();
        // Rounding up passes a machine whose size is not a power of two.
        let exponent = if exponent > uhi {
            exponent - 1.0
        } else {
            exponent
        };
        exponent.exp2()
    } else {
        log2.exp2().round()
    };
    (nodes as u32).clamp(1, max_nodes)
}

/// The model's runtime: e to a hyper-gamma draw whose short branch is
/// likelier for small jobs.
fn runtime<R: Rng>(rng: &mut R, nodes: u32) -> f64 {
    let p = (PA * f64::from(nodes) + PB).clamp(0.0, 1.0);
    loop {
        let (shape, scale) = if unit(rng) < p { (A1, B1) } else { (A2, B2) };
        let log_run = gamma(rng, shape, scale);
        if log_run <= MAX_LOG_RUN {
            break log_run.exp().floor();
        }
    }
}

/// A walltime request as users make them: the runtime padded by a factor
/// drawn uniformly in [1, 5], rounded up to a popular value.
///
/// The factor is our choice: Tsafrir, Etsion & Feitelson find requests
/// mostly a few times the runtime and bunched at popular values, and a
/// uniform [1, 5] gives that.
fn requested<R: Rng>(rng: &mut R, run_s: f64) -> f64 {
    let wanted = run_s * (1.0 + 4.0 * unit(rng));
    POPULAR_S
        .iter()
        .copied()
        .find(|&p| p >= wanted)
        .unwrap_or(LONGEST_S.max(run_s))
}

/// Lowers the requests of `share` of the jobs to the popular value just
/// below their runtime, as users who guess too short do: such jobs are
/// killed at their walltime.
///
/// Only jobs longer than the shortest popular value can be under-requested
/// with one, and about half the model's jobs are shorter: so the jobs are
/// drawn among the longer ones, as many as `share` of all jobs (all of
/// them if fewer), for the realised share to be the setting.
fn underestimate<R: Rng>(jobs: &mut [WorkloadJob], share: f64, rng: &mut R) {
    let mut eligible: Vec<usize> = jobs
        .iter()
        .enumerate()
        .filter(|(_, job)| job.run_s > POPULAR_S[0])
        .map(|(i, _)| i)
        .collect();
    let wanted = ((share * jobs.len() as f64).round() as usize).min(eligible.len());
    // The first `wanted` of a random permutation (Fisher–Yates, cut short).
    for k in 0..wanted {
        let pick = rng.random_range(k..eligible.len());
        eligible.swap(k, pick);
    }
    for &i in &eligible[..wanted] {
        let job = &mut jobs[i];
        if let Some(below) = POPULAR_S.iter().rev().copied().find(|&p| p < job.run_s) {
            job.requested_s = below;
        }
    }
}

/// The model's arrivals: gamma-distributed log inter-arrival times, paid
/// out of half-hour buckets weighted by the daily cycle, so that jobs
/// bunch in working hours. The day starts at midnight.
struct Arrivals {
    weights: [f64; BUCKETS],
    bucket: usize,
    /// Inter-arrival time drawn but not yet paid, in bucket weights.
    points: f64,
    /// How far into the current bucket the last arrival fell.
    remainder: f64,
    load_scale: f64,
}

impl Arrivals {
    fn new(load_scale: f64) -> Self {
        Self {
            weights: cycle_weights(),
            bucket: 0,
            points: 0.0,
            remainder: 0.0,
            load_scale,
        }
    }

    /// Seconds to the next arrival.
    fn gap<R: Rng>(&mut self, rng: &mut R) -> f64 {
        let log_gap = loop {
            let g = gamma(rng, AARR * ARAR, BARR);
            if g <= MAX_LOG_GAP {
                break g;
            }
        };
        self.points += log_gap.exp() / BUCKET_S / self.load_scale;
        let mut gap = 0.0;
        while self.points > self.weights[self.bucket] {
            self.points -= self.weights[self.bucket];
            self.bucket = (self.bucket + 1) % BUCKETS;
            gap += BUCKET_S;
        }
        let remainder = self.points / self.weights[self.bucket];
        gap += BUCKET_S * (remainder - self.remainder);
        self.remainder = remainder;
        gap
    }
}

/// Each half hour's weight in the daily cycle, with a mean of 1: the mass
/// of the gamma(ANUM, BNUM) density over its model bucket. Simpson's rule
/// on the unnormalised density will do, as the normalisation cancels.
fn cycle_weights() -> [f64; BUCKETS] {
    const STEPS: usize = 16;
    let density = |x: f64| x.powf(ANUM - 1.0) * (-x / BNUM).exp();
    let h = 1.0 / STEPS as f64;
    let mut weights = [0.0; BUCKETS];
    for i in CYCLE_START..CYCLE_START + BUCKETS {
        let low = i as f64 - 0.5;
        let inner: f64 = (1..STEPS)
            .map(|k| {
                let factor = if k.is_multiple_of(2) { 2.0 } else { 4.0 };
                factor * density(low + k as f64 * h)
            })
            .sum();
        // The program's buckets count from 1.
        weights[(i - 1) % BUCKETS] = (density(low) + inner + density(low + 1.0)) * h / 3.0;
    }
    let mean = weights.iter().sum::<f64>() / BUCKETS as f64;
    weights.map(|w| w / mean)
}

/// A gamma(shape, scale) draw, by Marsaglia & Tsang (2000); below shape 1,
/// a draw at shape + 1 times U^(1/shape).
fn gamma<R: Rng>(rng: &mut R, shape: f64, scale: f64) -> f64 {
    if shape < 1.0 {
        let boost = (1.0 - unit(rng)).powf(1.0 / shape);
        return gamma(rng, shape + 1.0, scale) * boost;
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = 1.0 - unit(rng);
        if u < 1.0 - 0.0331 * x.powi(4) || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
            return d * v * scale;
        }
    }
}

/// A standard normal draw (Box–Muller).
fn normal<R: Rng>(rng: &mut R) -> f64 {
    let radius = (-2.0 * (1.0 - unit(rng)).ln()).sqrt();
    radius * (std::f64::consts::TAU * unit(rng)).cos()
}

/// A uniform draw in [0, 1).
fn unit<R: Rng>(rng: &mut R) -> f64 {
    rng.random_range(0.0..1.0)
}

#[cfg(test)]
mod tests;
