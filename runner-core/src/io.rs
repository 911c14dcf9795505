//! What a job's effects act on, and the one loop that carries them out.
//! The runner's shell sends to the broker and writes the results
//! directory, the simulator acts in its simulated world; which answer
//! each effect owes the machine, and what a message too big for the
//! broker does to the job, is written here once for both.

use std::future::Future;

use gleaner_protocol::Core;

use gleaner_protocol::{ClusterName, KcmMsg, LauncherId, LauncherMsg};

use crate::{
    core::{JobEvent, JobMachine},
    effect::{Effect, Now},
    job::Kind,
    publication::{FirstAttempts, Publication},
    records::JobFile,
};

/// Where a job's effects are carried out.
pub trait Io {
    type Error;

    /// Sends to a cluster's kcm; whether it arrived (its queue exists).
    fn to_kcm(
        &mut self,
        cluster: &ClusterName,
        msg: KcmMsg,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Sends to a launcher; whether it arrived (it runs).
    fn to_launcher(
        &mut self,
        launcher: &LauncherId,
        msg: LauncherMsg,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Starts publishing a job's first attempts: what is all with the
    /// broker at once, or `None` if the rest follows later (the caller
    /// then hands the machine [`JobEvent::Published`] itself).
    fn publish_first(
        &mut self,
        first: FirstAttempts,
    ) -> impl Future<Output = Result<Option<Publication>, Self::Error>> + Send;

    /// Writes `job.json` as the machine has it now.
    fn save_job_file(&mut self, file: JobFile) -> Result<(), Self::Error>;

    /// Carries out an effect that owes the machine no answer.
    fn apply(&mut self, effect: Effect) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Why `error` is the job's own (a message over the broker's bound),
    /// if it is: the machine stops the job with it and the rest goes on.
    /// Any other error is returned, and ends the carrying out.
    fn unsendable(&mut self, error: Self::Error) -> Result<String, Self::Error>;
}

/// Carries out the machine's effects through `io`, handing each answer
/// back at once.
pub async fn carry_out<K, I>(
    machine: &mut JobMachine<K>,
    io: &mut I,
    now: Now,
) -> Result<(), I::Error>
where
    K: Kind,
    I: Io + Send,
{
    while let Some(effect) = machine.poll_effect(now) {
        let answer = match effect {
            Effect::ToKcm {
                cluster,
                msg,
                followup,
            } => io
                .to_kcm(&cluster, msg)
                .await
                .map(|arrived| Some(JobEvent::Delivered { followup, arrived })),
            Effect::ToLauncher {
                launcher,
                msg,
                followup,
            } => io
                .to_launcher(&launcher, msg)
                .await
                .map(|arrived| Some(JobEvent::Delivered { followup, arrived })),
            Effect::PublishFirst(first) => io
                .publish_first(first)
                .await
                .map(|published| published.map(JobEvent::Published)),
            Effect::SaveJobFile => io.save_job_file(machine.job().job_file()).map(|()| None),
            effect => io.apply(effect).await.map(|()| None),
        };
        match answer {
            Ok(Some(event)) => machine.handle(event, now),
            Ok(None) => {}
            Err(error) => {
                let problem = io.unsendable(error)?;
                machine.handle(JobEvent::Unsendable { problem }, now);
            }
        }
    }
    Ok(())
}
