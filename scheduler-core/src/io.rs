//! What the scheduler's effects act on, and the one loop that carries them
//! out. The scheduler's shell talks to the broker, the simulator hands the
//! decisions to its simulated runners; which answer each effect owes the
//! core is written here once for both.

use std::future::Future;

use gleaner_manifest::JobId;
use gleaner_protocol::{ControlMsg, Core, GridSnapshot, Now};

use crate::core::{Effect, Event, Post, Reply, SchedulerCore};

/// Where the scheduler's effects are carried out.
pub trait Io {
    type Error;

    /// The time, for the core.
    fn now(&self) -> Now;

    /// Becomes the active scheduler: takes users' requests from now on;
    /// what the last active one handed over, if anything.
    fn take_over(
        &mut self,
    ) -> impl Future<Output = Result<Option<GridSnapshot>, Self::Error>> + Send;

    /// Answers the request being handled, if its sender waits for one.
    fn reply(&mut self, reply: Reply) -> impl Future<Output = ()> + Send;

    /// Sends a user's order on to a job's runner (with the asker's address
    /// if `answerable`): whether it arrived, or why it cannot be sent (too
    /// big for the broker).
    fn forward(
        &mut self,
        job: &JobId,
        msg: ControlMsg,
        answerable: bool,
    ) -> impl Future<Output = Result<Result<bool, String>, Self::Error>> + Send;

    /// Hands a round's decisions to whoever sends them: the jobs already
    /// known to be gone (the others are told later, as [`Event::Gone`]),
    /// or `None` once nobody sends any more (the session is over).
    fn post(&mut self, post: Post) -> impl Future<Output = Option<Vec<JobId>>> + Send;

    /// Serves this metrics page from now on.
    fn metrics(&mut self, text: String);
}

/// Carries out the core's effects through `io`, handing each answer back
/// at once; `false` once nobody sends its decisions any more.
pub async fn carry_out<I: Io + Send>(
    core: &mut SchedulerCore,
    io: &mut I,
) -> Result<bool, I::Error> {
    while let Some(effect) = core.poll_effect(io.now()) {
        match effect {
            Effect::TakeOver => {
                let snapshot = io.take_over().await?;
                core.handle(Event::HandedOver(snapshot), io.now());
            }
            Effect::Reply(reply) => io.reply(reply).await,
            Effect::Forward {
                job,
                msg,
                answerable,
            } => {
                let answer = match io.forward(&job, msg, answerable).await? {
                    Ok(arrived) => Event::Forwarded { arrived },
                    Err(reason) => Event::Unforwardable { reason },
                };
                core.handle(answer, io.now());
            }
            Effect::Post(post) => {
                let Some(gone) = io.post(post).await else {
                    return Ok(false);
                };
                for job in gone {
                    core.handle(Event::Gone(job), io.now());
                }
            }
            Effect::Metrics(text) => io.metrics(text),
        }
    }
    Ok(true)
}
