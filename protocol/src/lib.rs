//! gleaner's protocol: every message its components exchange, one type per
//! queue, and how bodies are encoded.
//!
//! Nothing here knows about AMQP, so the services' pure cores can speak in
//! these types without depending on the transport; `gleaner-broker` carries
//! them.

pub mod codec;
mod messages;

pub use messages::*;
