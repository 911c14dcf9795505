//! A kcm's core: what it decides about its cluster (placeholders to
//! submit, withdraw or take back, grid components to start and let go,
//! what to report) as a state machine of events and time, with the batch
//! system's snapshot it reads and the failures it counts. Nothing here
//! does I/O: the shell (`gleaner-kcm`) runs the batch system's commands,
//! talks to the broker and carries out the effects.

pub mod barrier;
pub mod config;
pub mod core;
pub mod failures;
pub mod io;
pub mod snapshot;

use serde::{Deserialize, Serialize};

/// A batch-system command that failed, as the shell ran it: the core
/// reports it with its cluster's name and judges whose failure it was.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{command}: {message}")]
pub struct BackendError {
    /// The batch-system command that failed, as run.
    pub command: String,
    /// What went wrong, with the command's own output.
    pub message: String,
}

/// A limit on slots: a number, or a share of the cluster's (`"50%"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cap {
    Slots(u32),
    Fraction(f64),
}

impl Cap {
    /// The limit on a cluster of `total` slots.
    pub fn of(self, total: u32) -> u32 {
        match self {
            Self::Slots(slots) => slots,
            Self::Fraction(f) => (f64::from(total) * f).floor() as u32,
        }
    }
}

impl Serialize for Cap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Slots(slots) => serializer.serialize_u32(*slots),
            Self::Fraction(f) => serializer.serialize_str(&format!("{}%", f * 100.0)),
        }
    }
}

impl<'de> Deserialize<'de> for Cap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Slots(u32),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Slots(slots) => Ok(Self::Slots(slots)),
            Written::Text(text) => text
                .trim()
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<f64>().ok())
                .filter(|n| n.is_finite())
                .map(|n| Self::Fraction(n / 100.0))
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{text:?} is neither a number of slots nor a percentage like \"50%\""
                    ))
                }),
        }
    }
}
