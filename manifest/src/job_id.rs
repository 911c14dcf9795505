//! Job ids: `<name>-<6 hex>`, short enough to type and to appear in queue names.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A validated job id. Queue names are built from it, so it never holds
/// anything but `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a job id (expected <name>-<6 hex digits>, e.g. sweep-3fa9c2)")]
pub struct JobIdError(String);

pub(crate) fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl JobId {
    /// The id of a job named `name` (already validated) with a 24-bit suffix.
    pub fn new(name: &str, suffix: u32) -> Self {
        Self(format!("{name}-{:06x}", suffix & 0xff_ffff))
    }

    /// The job's name: the id without its suffix.
    pub fn name(&self) -> &str {
        &self.0[..self.0.len() - 7]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JobId {
    type Error = JobIdError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        let valid = value.len() > 7
            && value.rsplit_once('-').is_some_and(|(name, hex)| {
                is_valid_name(name)
                    && hex.len() == 6
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
        let id = JobId::new("my.sweep_1", 0x3fa9c2);
        assert_eq!(id.as_str(), "my.sweep_1-3fa9c2");
        assert_eq!(id.name(), "my.sweep_1");
        assert_eq!("my.sweep_1-3fa9c2".parse::<JobId>().unwrap(), id);
        for bad in [
            "",
            "abc",
            "x-12345",
            "x-1234567",
            "x-ABCDEF",
            "a b-123456",
            "-123456",
        ] {
            assert!(bad.parse::<JobId>().is_err(), "{bad}");
        }
    }
}
