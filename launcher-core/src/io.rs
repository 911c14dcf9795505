//! What a launcher's effects act on, and the one loop that carries them
//! out. The launcher's shell runs processes and talks to the broker, the
//! simulator acts in its simulated world; both hand the core what happened
//! and carry its effects out through [`turn`], which decides the order:
//! each event's effects in full, then what answered them at once, and the
//! launcher gone at its [`Effect::Leave`].

use std::{collections::VecDeque, future::Future};

use gleaner_protocol::{Core, Now};

use crate::{
    Exit,
    core::{Effect, Event, LauncherCore},
};

/// Where a launcher's effects are carried out.
pub trait Io<E> {
    /// The time, for the core.
    fn now(&self) -> Now;

    /// Carries out `effect` (never [`Effect::Leave`], which ends the
    /// turn); the events that answer it at once. Answers that take time
    /// (a task's end, a settlement) come back later, as the caller's own
    /// events.
    fn apply(&mut self, effect: Effect<E>) -> impl Future<Output = Vec<Event<E>>> + Send;
}

/// Hands `events` (`None`: the core's time event) to the core one after
/// the other, carrying out the effects of each through `io` and handing
/// back what answered them after the events already waiting; the
/// launcher's exit once it leaves.
pub async fn turn<E, I>(
    core: &mut LauncherCore<E>,
    io: &mut I,
    events: Vec<Option<Event<E>>>,
) -> Option<Result<Exit, E>>
where
    E: Send,
    I: Io<E> + Send,
{
    let mut pending = VecDeque::from(events);
    while let Some(event) = pending.pop_front() {
        let now = io.now();
        match event {
            Some(event) => core.handle(event, now),
            None => core.handle_timeout(now),
        }
        while let Some(effect) = core.poll_effect(now) {
            match effect {
                Effect::Leave(exit) => return Some(exit),
                effect => pending.extend(io.apply(effect).await.into_iter().map(Some)),
            }
        }
    }
    None
}
