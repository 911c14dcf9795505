//! Job ids: `<name>-<16 hex>`. The suffix is 64 random bits, so that ids
//! of one name do not collide by accident (24 bits did at ~4,000 jobs), and
//! short enough to appear in queue and batch job names. An id is public
//! (`qstat` shows it): what binds it to its owner is the runner's claim
//! (`gleaner.job.<id>.owner`), not its secrecy.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A validated job id. Queue names are built from it, so it never holds
/// anything but `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

/// Hex digits of an id's random suffix.
const SUFFIX: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a job id (expected <name>-<16 hex digits>, e.g. sweep-3fa9c2d41e07b5a8)")]
pub struct JobIdError(String);

pub(crate) fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl JobId {
    /// The id of a job named `name` (already validated) with a 64-bit suffix.
    pub fn new(name: &str, suffix: u64) -> Self {
        Self(format!("{name}-{suffix:016x}"))
    }

    /// The job's name: the id without its suffix.
    pub fn name(&self) -> &str {
        &self.0[..self.0.len() - SUFFIX - 1]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JobId {
    type Error = JobIdError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        let valid = value.rsplit_once('-').is_some_and(|(name, hex)| {
            is_valid_name(name)
                && hex.len() == SUFFIX
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        });
        if valid {
            Ok(Self(value))
        } else {
            Err(JobIdError(value))
        }
    }
}

impl std::str::FromStr for JobId {
    type Err = JobIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::try_from(s.to_owned())
    }
}

impl From<JobId> for String {
    fn from(id: JobId) -> Self {
        id.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for JobId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_validate() {
        let id = JobId::new("my.sweep_1", 0x3fa9_c2d4_1e07_b5a8);
        assert_eq!(id.as_str(), "my.sweep_1-3fa9c2d41e07b5a8");
        assert_eq!(id.name(), "my.sweep_1");
        assert_eq!("my.sweep_1-3fa9c2d41e07b5a8".parse::<JobId>().unwrap(), id);
        for bad in [
            "",
            "abc",
            "x-123456",
            "x-123456789abcdef",
            "x-123456789abcdef01",
            "x-ABCDEF0123456789",
            "a b-0123456789abcdef",
            "-0123456789abcdef",
        ] {
            assert!(bad.parse::<JobId>().is_err(), "{bad}");
        }
    }
}
