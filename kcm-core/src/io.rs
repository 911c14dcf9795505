//! What a kcm's effects act on, and the one loop that carries them out.
//! The kcm's shell does each command on the batch system, its spool and
//! the broker, the simulator in its simulated world; which answer each
//! command owes the core, and when, is written here once for both.

use std::future::Future;

use gleaner_manifest::{JobId, TaskShape};
use gleaner_protocol::{ComponentOutcome, ComponentSpec, ControlMsg, Credentials, SchedulerMsg};

use crate::{
    BackendError,
    core::{Core, Effect, Event, KcmCore, Now},
};

/// Launchers to submit for a grant, as [`Effect::SubmitLaunchers`] says.
#[derive(Debug)]
pub struct LauncherOrder<'a> {
    pub job: &'a JobId,
    pub slots: u32,
    /// One task's slots and needs: launchers hold whole tasks.
    pub task: TaskShape,
    /// Whose job it is (the broker user).
    pub owner: &'a str,
    /// The Unix account the launchers run as (`None`: the kcm's own).
    pub account: Option<&'a str>,
    /// The job's launcher account, for its launchers' settings file.
    pub credentials: Option<&'a Credentials>,
}

/// The kcm's commands, each doing what the [`Effect`] of its name says.
/// A batch-system command's failure is an answer for the core; an error
/// of `Self::Error` (the broker lost) ends the carrying out.
pub trait Io {
    type Error;

    /// The time, for the core.
    fn now(&self) -> Now;

    fn submit_launchers(
        &mut self,
        order: LauncherOrder<'_>,
    ) -> impl Future<Output = Result<u32, BackendError>> + Send;

    fn remove(&mut self, ids: &[String]) -> impl Future<Output = Result<(), BackendError>> + Send;

    fn delete_spool_entry(&mut self, job: &JobId, component: u32);

    fn stop_component(&mut self, job: &JobId, component: u32, stop: &str);

    fn release_component(&mut self, job: &JobId, component: u32, go: &str, hosts: &str);

    /// Starts staging a component's inputs; its end comes back later as
    /// [`Event::InputsStaged`], through the shell's own loop.
    fn stage_inputs(&mut self, spec: ComponentSpec, inputs: Vec<String>, account: Option<String>);

    fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        one_host: bool,
        account: Option<&str>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    fn tell(
        &mut self,
        job: &JobId,
        message: ControlMsg,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Tells the job its component ended, its output filled in.
    fn report_component_end(
        &mut self,
        job: &JobId,
        outcome: ComponentOutcome,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    fn to_scheduler(
        &mut self,
        message: SchedulerMsg,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    fn announce(
        &mut self,
        event: gleaner_protocol::Event,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    fn forget_launcher_settings(&mut self, job: &JobId);
}

/// Carries out the core's effects through `io`, handing each command's
/// answer back at once; `true` when the core asked for a poll, which its
/// caller reads once the message at hand is settled.
pub async fn carry_out<I: Io + Send>(core: &mut KcmCore, io: &mut I) -> Result<bool, I::Error> {
    let mut poll_now = false;
    while let Some(effect) = core.poll_effect(io.now()) {
        let answer = match effect {
            Effect::SubmitLaunchers {
                job,
                grant,
                slots,
                task,
                owner,
                account,
                credentials,
            } => {
                let order = LauncherOrder {
                    job: &job,
                    slots,
                    task,
                    owner: &owner,
                    account: account.as_deref(),
                    credentials: credentials.as_ref(),
                };
                let result = io.submit_launchers(order).await;
                Some(Event::LaunchersSubmitted {
                    job,
                    grant,
                    requested: slots,
                    result,
                })
            }
            Effect::Remove { ids } => Some(Event::Removed(io.remove(&ids).await)),
            Effect::DeleteSpoolEntry { job, component } => {
                io.delete_spool_entry(&job, component);
                None
            }
            Effect::StopComponent {
                job,
                component,
                stop,
            } => {
                io.stop_component(&job, component, &stop);
                None
            }
            Effect::ReleaseComponent {
                job,
                component,
                go,
                hosts,
            } => {
                io.release_component(&job, component, &go, &hosts);
                None
            }
            Effect::StageInputs {
                spec,
                inputs,
                account,
            } => {
                io.stage_inputs(spec, inputs, account);
                None
            }
            Effect::SubmitComponent {
                spec,
                one_host,
                account,
            } => {
                let result = io
                    .submit_component(&spec, one_host, account.as_deref())
                    .await;
                Some(Event::ComponentSubmitted { spec, result })
            }
            Effect::Tell { job, message } => {
                io.tell(&job, message).await?;
                None
            }
            Effect::ReportComponentEnd { job, outcome } => {
                let component = outcome.component;
                io.report_component_end(&job, outcome).await?;
                Some(Event::ComponentReported { job, component })
            }
            Effect::ToScheduler(message) => {
                io.to_scheduler(message).await?;
                None
            }
            Effect::Announce(event) => {
                io.announce(event).await?;
                None
            }
            Effect::PollNow => {
                poll_now = true;
                None
            }
            Effect::ForgetLauncherSettings { job } => {
                io.forget_launcher_settings(&job);
                None
            }
        };
        if let Some(event) = answer {
            core.handle(event, io.now());
        }
    }
    Ok(poll_now)
}
