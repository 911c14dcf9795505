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

/// When `core` next wants its time event, as seen from `now` (the wall
/// clock moved as far as the monotonic one), if it wants one.
pub fn next_wake_up<C: Core>(core: &C, now: Now) -> Option<Now> {
    let due = core.poll_timeout()?.max(now.instant);
    let ahead = due.duration_since(now.instant);
    Some(Now {
        instant: due,
        wall_ms: now.wall_ms.saturating_add(ahead.as_millis() as Millis),
    })
}

/// Moves `core` on to its next wake-up: the time then, and the effects of
/// its time event; `None` if only an event can give it something to do.
/// A test steps a core through its timers with it, as a shell sleeping
/// until the wake-up would.
pub fn wake_up<C: Core>(core: &mut C, now: Now) -> Option<(Now, Vec<C::Effect>)> {
    let then = next_wake_up(core, now)?;
    core.handle_timeout(then);
    Some((then, drain(core, then)))
}

/// Panics if `core` still has an effect for its shell: a test's check that
/// an event led to nothing more than it took.
pub fn assert_settled<C: Core>(core: &mut C, now: Now)
where
    C::Effect: std::fmt::Debug,
{
    let left = drain(core, now);
    assert!(left.is_empty(), "effects left: {left:?}");
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

    /// A core that beats every `period`, once started.
    struct Beat {
        period: std::time::Duration,
        next: Option<Instant>,
        out: Outbox<u64>,
    }

    impl Core for Beat {
        type Event = ();
        type Effect = u64;

        fn handle(&mut self, (): (), now: Now) {
            self.next = Some(now.instant + self.period);
        }

        fn poll_effect(&mut self, _now: Now) -> Option<u64> {
            self.out.pop()
        }

        fn poll_timeout(&self) -> Option<Instant> {
            self.next
        }

        fn handle_timeout(&mut self, now: Now) {
            if self.next.is_some_and(|next| next <= now.instant) {
                self.out.push([now.wall_ms]);
                self.next = Some(now.instant + self.period);
            }
        }
    }

    #[test]
    fn a_core_is_stepped_from_wake_up_to_wake_up_with_both_clocks() {
        let t0 = Now {
            instant: Instant::now(),
            wall_ms: 1_000,
        };
        let mut beat = Beat {
            period: std::time::Duration::from_millis(250),
            next: None,
            out: Outbox::default(),
        };
        assert_eq!(wake_up(&mut beat, t0), None, "nothing before it starts");
        beat.handle((), t0);
        assert_settled(&mut beat, t0);
        let (first, effects) = wake_up(&mut beat, t0).unwrap();
        assert_eq!(effects, [1_250]);
        let (second, effects) = wake_up(&mut beat, first).unwrap();
        assert_eq!((second.wall_ms, effects), (1_500, vec![1_500]));
        assert_eq!(
            advance(&mut beat, second),
            Vec::<u64>::new(),
            "not due again yet"
        );
    }
}
