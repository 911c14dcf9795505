//! gleaner's protocol: every message its components exchange, one type per
//! queue, the identifiers they carry ([`ClusterName`], [`LauncherId`],
//! [`GrantId`]), how bodies are encoded, and the names gleaner's jobs and
//! launchers have in a batch system ([`naming`]).
//!
//! Nothing here knows about AMQP, so the services' pure cores can speak in
//! these types without depending on the transport; `gleaner-broker` carries
//! them.

pub mod codec;
mod core;
mod ids;
mod messages;
pub mod naming;
mod text;

pub use core::{
    Core, Now, Outbox, advance, assert_settled, drain, is_due, next_wake_up, now_ms, wake_up,
};
pub use ids::{ClusterName, GrantId, LauncherId, MAX_HELD_GPUS, is_device_name, is_name};
pub use messages::*;
pub use text::{REASON_BYTES, cut, cut_reason};
