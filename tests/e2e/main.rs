//! gleaner end to end, against the real components: RabbitMQ (one vhost
//! per test), Grid Engine and Slurm from `deploy/`, the Unix accounts
//! alice and bob, and test hosts in network namespaces. One binary, a
//! module per topic, so the suite links once.

mod bag_of_tasks;
mod batch_names;
mod chaos;
mod faults;
mod grid_engine;
mod multi_host;
mod replicated_broker;
mod scheduling;
mod slurm;
mod users;
