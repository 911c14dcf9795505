//! Moldable grid components (seed 002): `slots = { min = 4, max = 64 }`
//! with how the runtime shrinks with slots — `speedup = "amdahl:0.9"`
//! (the parallel fraction; the job's `walltime` is the one on `min`
//! slots) or a table of runtimes by slot count (`speedup = { 4 = "2h",
//! 16 = "40m" }`, whose entries are the walltimes). The scheduler picks
//! the slot count per cluster.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

/// The most slots a moldable component may range up to.
pub const MAX_MOLDABLE_SLOTS: u32 = 65_536;

/// A component's slots: a number, or a range for the scheduler to pick from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Slots {
    Fixed(u32),
    Range { min: u32, max: u32 },
}

impl Slots {
    /// The fewest it runs on: what it asks where nothing else is chosen.
    pub fn min(self) -> u32 {
        match self {
            Self::Fixed(n) => n,
            Self::Range { min, .. } => min,
        }
    }

    pub fn max(self) -> u32 {
        match self {
            Self::Fixed(n) => n,
            Self::Range { max, .. } => max,
        }
    }
}

impl From<u32> for Slots {
    fn from(n: u32) -> Self {
        Self::Fixed(n)
    }
}

/// How a moldable component's runtime shrinks with its slots, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Speedup {
    /// `"amdahl:F"`, F the parallel fraction in [0, 1].
    Law(String),
    /// Runtimes (walltimes) by slot count.
    Table(BTreeMap<String, String>),
}

/// A moldable component as the scheduler weighs it: its range and its
/// walltime at each slot count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Moldable {
    pub min: u32,
    pub max: u32,
    /// Amdahl's parallel fraction, with `walltime_ms` on `min` slots; or
    /// the table's walltimes by slot count.
    pub curve: Curve,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Curve {
    Amdahl { fraction: f64, walltime_ms: u64 },
    Table(BTreeMap<u32, u64>),
}

impl Moldable {
    /// The range and curve a manifest gives, or why they are wrong. Amdahl
    /// needs the job's walltime (on `min` slots).
    pub fn read(
        slots: Slots,
        speedup: &Speedup,
        walltime: Option<Duration>,
    ) -> Result<Self, String> {
        let Slots::Range { min, max } = slots else {
            return Err("a speedup is for slots = { min, max }".to_owned());
        };
        if min == 0 || min > max || max > MAX_MOLDABLE_SLOTS {
            return Err(format!(
                "slots need 1 <= min <= max <= {MAX_MOLDABLE_SLOTS}"
            ));
        }
        let curve = match speedup {
            Speedup::Law(text) => {
                let fraction = text
                    .strip_prefix("amdahl:")
                    .and_then(|f| f.trim().parse::<f64>().ok())
                    .filter(|f| (0.0..=1.0).contains(f))
                    .ok_or_else(|| {
                        format!("speedup {text:?}: \"amdahl:F\" with F between 0 and 1, or a table of runtimes by slots")
                    })?;
                let walltime = walltime.ok_or_else(|| {
                    "speedup \"amdahl:…\" scales the job's walltime (on min slots): set walltime"
                        .to_owned()
                })?;
                Curve::Amdahl {
                    fraction,
                    walltime_ms: walltime.as_millis() as u64,
                }
            }
            Speedup::Table(table) => {
                let mut curve = BTreeMap::new();
                for (slots, runtime) in table {
                    let n = slots
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (min..=max).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "speedup: {slots:?} is not a slot count between {min} and {max}"
                            )
                        })?;
                    let runtime = humantime::parse_duration(runtime)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| format!("speedup: {runtime:?} is not a duration"))?;
                    curve.insert(n, runtime.as_millis() as u64);
                }
                if curve.is_empty() {
                    return Err("speedup: the table names no slot count".to_owned());
                }
                Curve::Table(curve)
            }
        };
        Ok(Self { min, max, curve })
    }

    /// The most slots it may get within `free`: any count in its range
    /// under Amdahl, the table's otherwise.
    pub fn at_most(&self, free: u32) -> Option<u32> {
        match &self.curve {
            Curve::Amdahl { .. } => Some(free.min(self.max)).filter(|n| *n >= self.min),
            Curve::Table(table) => table.range(..=free).next_back().map(|(n, _)| *n),
        }
    }

    /// Its walltime on `slots` slots (ms, on a node of speed 1).
    pub fn walltime_ms(&self, slots: u32) -> u64 {
        match &self.curve {
            Curve::Amdahl {
                fraction,
                walltime_ms,
            } => {
                let time = |n: u32| (1.0 - fraction) + fraction / f64::from(n.max(1));
                (*walltime_ms as f64 * time(slots) / time(self.min)).ceil() as u64
            }
            Curve::Table(table) => table
                .range(..=slots)
                .next_back()
                .or_else(|| table.iter().next())
                .map_or(0, |(_, ms)| *ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amdahl_scales_the_walltime_on_min_slots() {
        let m = Moldable::read(
            Slots::Range { min: 4, max: 64 },
            &Speedup::Law("amdahl:0.9".into()),
            Some(Duration::from_secs(3600)),
        )
        .unwrap();
        assert_eq!(m.walltime_ms(4), 3_600_000);
        // (0.1 + 0.9/16) / (0.1 + 0.9/4) of an hour.
        assert_eq!(m.walltime_ms(16), 1_730_770);
        assert_eq!(
            (m.at_most(3), m.at_most(10), m.at_most(100)),
            (None, Some(10), Some(64))
        );
    }

    #[test]
    fn a_table_gives_the_walltimes_of_its_slot_counts() {
        let table = [("4", "2h"), ("16", "40m")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        let m = Moldable::read(
            Slots::Range { min: 4, max: 16 },
            &Speedup::Table(table),
            None,
        )
        .unwrap();
        assert_eq!(
            (m.at_most(3), m.at_most(10), m.at_most(16)),
            (None, Some(4), Some(16))
        );
        assert_eq!(m.walltime_ms(16), 2_400_000);
        assert_eq!(m.walltime_ms(4), 7_200_000);
    }

    #[test]
    fn bad_ranges_and_curves_are_refused() {
        let amdahl = Speedup::Law("amdahl:0.9".into());
        let hour = Some(Duration::from_secs(3600));
        for (slots, speedup, walltime) in [
            (Slots::Range { min: 0, max: 4 }, amdahl.clone(), hour),
            (Slots::Range { min: 8, max: 4 }, amdahl.clone(), hour),
            (Slots::Fixed(4), amdahl.clone(), hour),
            (Slots::Range { min: 4, max: 8 }, amdahl.clone(), None),
            (
                Slots::Range { min: 4, max: 8 },
                Speedup::Law("amdahl:1.5".into()),
                hour,
            ),
            (
                Slots::Range { min: 4, max: 8 },
                Speedup::Law("linear".into()),
                hour,
            ),
            (
                Slots::Range { min: 4, max: 8 },
                Speedup::Table([("32".to_owned(), "1h".to_owned())].into()),
                None,
            ),
            (
                Slots::Range { min: 4, max: 8 },
                Speedup::Table([("4".to_owned(), "soon".to_owned())].into()),
                None,
            ),
        ] {
            assert!(
                Moldable::read(slots, &speedup, walltime).is_err(),
                "{slots:?} {speedup:?}"
            );
        }
    }
}
