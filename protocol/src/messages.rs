//! Every message gleaner's components exchange, one type per queue.
//!
//! Bodies are MessagePack maps (rmp-serde `to_vec_named`) inside an
//! [`Envelope`]; fields added later carry `#[serde(default)]` so that mixed
//! versions keep talking. Enums are tagged with a `kind` field, which is also
//! the AMQP `type` property, so the management UI shows what a message is.

use std::collections::BTreeMap;

use gleaner_manifest::{Addition, JobId, JobKind, Manifest, Moldable, Needs, Priority, TaskShape};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{ClusterName, GrantId, LauncherId};

/// Version of the wire format; bumped only for changes old readers cannot skip.
pub const PROTOCOL_VERSION: u16 = 1;

/// What travels in every message body: the protocol version, who sent it, and the message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<M> {
    pub v: u16,
    pub from: String,
    pub msg: M,
}

/// A message body type; `kind` becomes the AMQP `type` property. For tagged
/// enums it is the serde tag, so the management UI and the body agree (the
/// tests hold every variant to that).
pub trait Message: Serialize + DeserializeOwned + Send + Sync {
    fn kind(&self) -> &'static str;
}

/// Milliseconds since the Unix epoch; the unit of every timestamp on the wire.
pub type Millis = u64;

// What fields the wire may leave out, for serde.
fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

mod claim;
mod control;
mod events;
mod grid_handover;
mod kcm;
mod launcher;
mod requests;
mod results;
mod scheduler;
mod submission;
mod tasks;

pub use claim::*;
pub use control::*;
pub use events::*;
pub use grid_handover::*;
pub use kcm::*;
pub use launcher::*;
pub use requests::*;
pub use results::*;
pub use scheduler::*;
pub use submission::*;
pub use tasks::*;

#[cfg(test)]
mod tests;
