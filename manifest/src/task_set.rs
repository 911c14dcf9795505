//! A set of task numbers, written as a user writes it (`3,7-12`): what
//! `gleaner resubmit --tasks` takes and a rerun's manifest carries.
//!
//! Kept as sorted, disjoint ranges, so that "every failed task of a
//! million" costs as many ranges as there are runs of failures.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Span;

/// Task numbers; ranges inclusive at both ends, sorted, disjoint and not
/// touching.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskSet {
    ranges: Vec<(u64, u64)>,
}

impl TaskSet {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many tasks.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a + 1).sum()
    }

    pub fn contains(&self, task: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, end)| end < task);
        self.ranges.get(i).is_some_and(|&(start, _)| start <= task)
    }

    /// The highest number in the set.
    pub fn last(&self) -> Option<u64> {
        self.ranges.last().map(|&(_, end)| end)
    }

    /// The numbers, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|&(a, b)| a..=b)
    }

    /// The numbers in both sets.
    pub fn intersection(&self, other: &TaskSet) -> TaskSet {
        self.iter().filter(|&t| other.contains(t)).collect()
    }

    /// The set of these ranges, in any order: sorted once, then merged
    /// where they overlap or touch.
    fn of_ranges(mut ranges: Vec<(u64, u64)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some((_, last)) if start <= last.saturating_add(1) => *last = (*last).max(end),
                _ => merged.push((start, end)),
            }
        }
        Self { ranges: merged }
    }
}

impl FromIterator<u64> for TaskSet {
    fn from_iter<I: IntoIterator<Item = u64>>(numbers: I) -> Self {
        Self::of_ranges(numbers.into_iter().map(|n| (n, n)).collect())
    }
}

impl fmt::Display for TaskSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(start, end)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match start == end {
                true => write!(f, "{start}")?,
                false => write!(f, "{start}-{end}")?,
            }
        }
        Ok(())
    }
}

impl FromStr for TaskSet {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for span in Span::list(text) {
            match span? {
                Span {
                    first,
                    last,
                    step: 1,
                } => ranges.push((first, last)),
                _ => {
                    return Err(format!(
                        "{text:?}: write task numbers and ranges, like 3,7-12"
                    ));
                }
            }
        }
        let set = Self::of_ranges(ranges);
        if set.is_empty() {
            return Err("no task numbers given".to_owned());
        }
        Ok(set)
    }
}

impl Serialize for TaskSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_print_compactly() {
        let set: TaskSet = "7-12, 3, 13,1-2,20".parse().unwrap();
        assert_eq!(set.to_string(), "1-3,7-13,20");
        assert_eq!(set.len(), 11);
        assert!(set.contains(3) && set.contains(13) && set.contains(20));
        assert!(!set.contains(0) && !set.contains(5) && !set.contains(14));
        assert_eq!(set.last(), Some(20));
    }

    #[test]
    fn from_numbers_in_any_order() {
        let set: TaskSet = [9, 1, 2, 3, 5, 2, 8].into_iter().collect();
        assert_eq!(set.to_string(), "1-3,5,8-9");
        assert_eq!(set.iter().collect::<Vec<_>>(), [1, 2, 3, 5, 8, 9]);
        let other: TaskSet = "2-8".parse().unwrap();
        assert_eq!(set.intersection(&other).to_string(), "2-3,5,8");
    }

    #[test]
    fn bad_sets_are_refused() {
        for text in ["", ",", "a", "3-", "5-2", "-1", "1-2-3"] {
            assert!(text.parse::<TaskSet>().is_err(), "{text:?} was accepted");
        }
    }

    #[test]
    fn travels_as_its_text() {
        let set: TaskSet = "0,4-6".parse().unwrap();
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(json, "\"0,4-6\"");
        assert_eq!(serde_json::from_str::<TaskSet>(&json).unwrap(), set);
    }
}
