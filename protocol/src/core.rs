//! The one shape of every service's core: it takes events with the time
//! ([`Now`]) and keeps the effects it decides in an [`Outbox`]; its shell
//! takes them one at a time ([`Core::poll_effect`]), does each one's I/O,
//! and hands any answer back as an event. The order effects are carried out
//! in, what an answer leads to, and what follows what are all decided here,
//! in the core, so that a service and the simulator drive a core with the
//! same loop.

use std::{collections::VecDeque, time::Instant};

use crate::Millis;

/// When an event happens, on the two clocks the services' cores use: the
/// monotonic one for intervals and graces, the wall clock for what goes on
/// the wire and on disk. Shells read it once per event ([`Now::read`]); a
/// simulator sets both from its own clock; cores never read a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub instant: Instant,
    pub wall_ms: Millis,
}

impl Now {
    /// The time now, for a shell.
    pub fn read() -> Self {
        Self {
            instant: Instant::now(),
            wall_ms: now_ms(),
        }
    }
}

/// Now, in wire units.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A service's decisions. A shell feeds it events with the time, then
/// carries out [`Core::poll_effect`]'s effects until there are none, each
/// before the next event; between events it sleeps until the next message
/// or [`Core::poll_timeout`], whichever comes first. Every timer a service
/// has (a round, a heartbeat, a reading of the batch system, a grace that
/// runs out) is the core's: a shell keeps no clock of its own, and a
/// simulator jumps from one core's wake-up to the next.
pub trait Core {
    type Event;
    type Effect;
    /// Decides what `event`, at `now`, calls for. Its effects wait in the
    /// core; an answer to an effect is decided before the effects queued
    /// after it.
    fn handle(&mut self, event: Self::Event, now: Now);
    /// The next effect to carry out, or `None` until the next event.
    fn poll_effect(&mut self, now: Now) -> Option<Self::Effect>;
    /// When the core next wants [`Core::handle_timeout`], or `None` if
    /// only an event can give it something to do. A deadline is on the
    /// monotonic clock: the wall clock is read when the time comes.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The time event: [`Core::poll_timeout`]'s deadline has come, or a
    /// shell woke early. A core does what is due at `now` and nothing
    /// else, so a spurious call is harmless.
    fn handle_timeout(&mut self, now: Now);
}

/// Every effect `core` has decided, in order: what a test, or a shell with
/// nothing to answer, takes after an event.
pub fn drain<C: Core>(core: &mut C, now: Now) -> Vec<C::Effect> {
    std::iter::from_fn(|| core.poll_effect(now)).collect()
}

/// Whether `core`'s wake-up has come by `now`.
pub fn is_due<C: Core>(core: &C, now: Now) -> bool {
    core.poll_timeout().is_some_and(|due| due <= now.instant)
}

/// The time event at `now` if `core` wants it by then, and the effects it
/// leads to; nothing if its deadline is later (or it has none).
pub fn advance<C: Core>(core: &mut C, now: Now) -> Vec<C::Effect> {
    if is_due(core, now) {
        core.handle_timeout(now);
    }
    drain(core, now)
}

/// Effects a core has decided and its shell has yet to carry out, in order.
#[derive(Debug)]
pub struct Outbox<T> {
    queue: VecDeque<T>,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
        }
    }
}

impl<T> Outbox<T> {
    /// After everything decided so far.
    pub fn push(&mut self, effects: impl IntoIterator<Item = T>) {
        self.queue.extend(effects);
    }

    /// Before everything else, in their order: what an answer leads to
    /// comes before the effects that were waiting behind its question.
    pub fn push_front(&mut self, effects: impl IntoIterator<Item = T>) {
        let mut effects: Vec<T> = effects.into_iter().collect();
        while let Some(effect) = effects.pop() {
            self.queue.push_front(effect);
        }
    }

    pub fn pop(&mut self) -> Option<T> {
        self.queue.pop_front()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_jump_the_queue_in_their_order() {
        let mut outbox = Outbox::default();
        outbox.push([1, 2]);
        assert_eq!(outbox.pop(), Some(1));
        outbox.push_front([10, 11]);
        outbox.push([3]);
        let order: Vec<_> = std::iter::from_fn(|| outbox.pop()).collect();
        assert_eq!(order, [10, 11, 2, 3]);
        assert!(outbox.is_empty());
    }
}
