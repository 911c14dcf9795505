//! Test and benchmark harness: every test gets its own RabbitMQ vhost, its
//! own directory and its own gleaner processes, all removed when it ends.

mod broker;
pub mod chaos;
mod gpus;
mod harness;
mod hosts;
mod sge;
mod slurm;
pub mod terminal;
pub mod users;

pub use broker::*;
pub use gpus::*;
pub use harness::*;
pub use hosts::*;
pub use sge::*;
pub use slurm::*;
