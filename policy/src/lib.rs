//! gleaner's policies, as pure functions over plain data: no I/O, no clock,
//! no broker. The services gather a snapshot, ask a policy, and carry out
//! its decisions; tests and simulations call the same functions directly.

pub mod access;
pub mod ect;
pub mod local;
pub mod placement;
pub mod preempt;
pub mod reallocation;
pub mod share;
