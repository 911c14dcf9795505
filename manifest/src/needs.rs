//! What a task needs beside its slots: memory and GPUs. Real clusters are
//! governed by both, so a placeholder asks the batch system for them, a
//! launcher runs a task only where they fit, and the kcm frees them for a
//! local job that waits for them.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error};

/// The most memory one task may ask for: more than any host has is a typo.
pub const MAX_TASK_MEMORY_MB: u64 = 64 << 20;

/// The most GPUs one task may ask for.
pub const MAX_TASK_GPUS: u32 = 64;

/// A task's memory and GPUs; zero is "nothing asked" (the site's default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Needs {
    /// Mebibytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_mb: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

impl Needs {
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Memory per slot over `slots`, rounded up: how batch systems that
    /// count memory by slot (Grid Engine's consumables, Slurm's
    /// `--mem-per-cpu`) are asked.
    pub fn memory_per_slot_mb(self, slots: u32) -> u64 {
        self.memory_mb.div_ceil(u64::from(slots.max(1)))
    }

    /// What `tasks` such tasks need together.
    pub fn times(self, tasks: u32) -> Self {
        Self {
            memory_mb: self.memory_mb.saturating_mul(u64::from(tasks)),
            gpus: self.gpus.saturating_mul(tasks),
        }
    }
}

/// Counts from batch systems and configurations add without overflowing.
impl std::ops::Add for Needs {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            memory_mb: self.memory_mb.saturating_add(other.memory_mb),
            gpus: self.gpus.saturating_add(other.gpus),
        }
    }
}

impl std::iter::Sum for Needs {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |all, n| all + n)
    }
}

/// One task's slots and needs: a launcher holds whole tasks of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskShape {
    pub slots: u32,
    #[serde(default, skip_serializing_if = "Needs::is_none")]
    pub needs: Needs,
}

impl TaskShape {
    pub fn slots(slots: u32) -> Self {
        Self {
            slots,
            needs: Needs::default(),
        }
    }

    /// Whole tasks in `slots` (at least one).
    pub fn tasks_in(&self, slots: u32) -> u32 {
        (slots / self.slots.max(1)).max(1)
    }

    /// What a launcher of `slots` slots needs beside them.
    pub fn needs_of(&self, slots: u32) -> Needs {
        self.needs.times(self.tasks_in(slots))
    }
}

/// A manifest's `memory = "8G"`, in mebibytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Memory(pub u64);

impl Memory {
    /// `8G`, `512M`, `1.5G`, `2T`, `4096K` (binary units; `GB`, `GiB` alike).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let digits = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let unit = unit.trim();
        let scale: f64 = match unit
            .to_ascii_uppercase()
            .trim_end_matches("IB")
            .trim_end_matches('B')
        {
            "K" => 1.0 / 1024.0,
            "M" => 1.0,
            "G" => 1024.0,
            "T" => 1024.0 * 1024.0,
            _ => {
                return Err(format!(
                    "{text:?} is not a size; write it like \"8G\" or \"512M\""
                ));
            }
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a size; write it like \"8G\" or \"512M\""))?;
        let mb = (value * scale).ceil();
        if !(1.0..=MAX_TASK_MEMORY_MB as f64).contains(&mb) {
            return Err(format!(
                "{text:?} must be from 1M to {}T",
                MAX_TASK_MEMORY_MB >> 20
            ));
        }
        Ok(Self(mb as u64))
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            mb if mb % 1024 == 0 => write!(f, "{}G", mb / 1024),
            mb => write!(f, "{mb}M"),
        }
    }
}

impl Serialize for Memory {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Memory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(|e| D::Error::custom(format!("memory: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_and_round_up_to_a_mebibyte() {
        let mb = |text| Memory::parse(text).map(|m| m.0);
        assert_eq!(mb("8G"), Ok(8192));
        assert_eq!(mb("8GiB"), Ok(8192));
        assert_eq!(mb("8gb"), Ok(8192));
        assert_eq!(mb("512M"), Ok(512));
        assert_eq!(mb("1.5G"), Ok(1536));
        assert_eq!(mb("1500K"), Ok(2));
        assert_eq!(mb("2T"), Ok(2 << 20));
        for bad in ["8", "G", "eight", "8X", "-1G", "0M", "1.2.3G", "100T", ""] {
            assert!(mb(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Memory(8192).to_string(), "8G");
        assert_eq!(Memory(1500).to_string(), "1500M");
    }

    #[test]
    fn a_launcher_needs_what_its_whole_tasks_need() {
        let shape = TaskShape {
            slots: 2,
            needs: Needs {
                memory_mb: 3000,
                gpus: 1,
            },
        };
        assert_eq!(shape.tasks_in(5), 2);
        assert_eq!(
            shape.needs_of(4),
            Needs {
                memory_mb: 6000,
                gpus: 2
            }
        );
        assert_eq!(shape.needs.memory_per_slot_mb(shape.slots), 1500);
        assert_eq!(shape.needs.memory_per_slot_mb(3), 1000);
        assert_eq!(Needs::default().memory_per_slot_mb(0), 0);
        assert_eq!(TaskShape::slots(3).needs_of(3), Needs::default());
    }
}
