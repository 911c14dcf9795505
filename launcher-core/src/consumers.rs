//! Which task consumer a launcher holds, decided apart from opening and
//! cancelling it. RabbitMQ cannot change a consumer's prefetch: a new
//! prefetch takes a new consumer. A higher one replaces the consumer at
//! once, the replaced one retiring (what it still delivers is taken before
//! the new one's, which the broker sent after). A lower one cancels the
//! consumer and opens the next only once the cancelled one has delivered
//! its last and fewer messages than the new prefetch are held: opened at
//! once, it would add its own to those the cancelled one still holds.
//! A quorum queue takes back itself what is still on its way to a consumer
//! when the cancel reaches it, and counts that against the message's
//! delivery limit: the runner tells such returns from launchers' deaths.

/// What to do with the task consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swap {
    /// Nothing.
    Keep,
    /// Open a consumer of this prefetch; cancel the current one, which
    /// retires (still delivers) if `retire`.
    Replace { prefetch: u16, retire: bool },
    /// Cancel the current consumer; the next is opened later.
    Cancel,
    /// Open a consumer of this prefetch: the current one has ended.
    Open { prefetch: u16 },
}

/// The task consumers' state.
#[derive(Debug)]
pub struct Consumers {
    /// The current consumer may still deliver: its stream has not ended.
    open: bool,
    /// The current consumer was cancelled: no more consuming was asked
    /// for, or a lower prefetch.
    cancelled: bool,
    /// The prefetch asked for last.
    prefetch: u16,
    /// A lower prefetch, for a consumer opened once fewer messages than it
    /// are held.
    reopen_below: Option<u16>,
    /// Replaced consumers that may still deliver.
    retiring: usize,
}

impl Consumers {
    /// One consumer, open with `prefetch`.
    pub fn new(prefetch: u16) -> Self {
        Self {
            open: true,
            cancelled: false,
            prefetch,
            reopen_below: None,
            retiring: 0,
        }
    }

    /// Whether the current consumer may still deliver.
    pub fn may_deliver(&self) -> bool {
        self.open
    }

    /// A prefetch of `messages` is asked for, with `held` messages held.
    pub fn prefetch(&mut self, messages: u32, held: usize) -> Swap {
        let prefetch = u16::try_from(messages).unwrap_or(u16::MAX);
        let raised = prefetch > self.prefetch;
        self.prefetch = prefetch;
        if self.reopen_below.is_some() {
            self.reopen_below = Some(prefetch);
            return self.reopen_due(held);
        }
        if self.cancelled {
            return Swap::Keep;
        }
        if raised {
            let retire = std::mem::replace(&mut self.open, true);
            self.retiring += usize::from(retire);
            Swap::Replace { prefetch, retire }
        } else {
            self.cancelled = true;
            self.reopen_below = Some(prefetch);
            Swap::Cancel
        }
    }

    /// No more tasks: the current consumer is cancelled (once), and no
    /// new one comes.
    pub fn stop(&mut self) -> Swap {
        self.reopen_below = None;
        match std::mem::replace(&mut self.cancelled, true) {
            true => Swap::Keep,
            false => Swap::Cancel,
        }
    }

    /// The current consumer's stream ended, with `held` messages held.
    pub fn current_ended(&mut self, held: usize) -> Swap {
        self.open = false;
        self.reopen_due(held)
    }

    /// The oldest retiring consumer's stream ended.
    pub fn retired_ended(&mut self) {
        self.retiring = self.retiring.saturating_sub(1);
    }

    /// A message was settled: `held` are held now.
    pub fn settled(&mut self, held: usize) -> Swap {
        self.reopen_due(held)
    }

    /// The consumer a [`Swap::Open`] or [`Swap::Replace`] asked for is open.
    pub fn opened(&mut self) {
        self.open = true;
        self.cancelled = false;
    }

    /// Every consumer has ended and no new one is due: nothing more can
    /// be delivered.
    pub fn all_ended(&self) -> bool {
        !self.open && self.retiring == 0 && self.reopen_below.is_none()
    }

    fn reopen_due(&mut self, held: usize) -> Swap {
        match self.reopen_below {
            Some(prefetch) if !self.open && held < usize::from(prefetch) => {
                self.reopen_below = None;
                Swap::Open { prefetch }
            }
            _ => Swap::Keep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_prefetch_replaces_the_consumer_at_once() {
        let mut consumers = Consumers::new(2);
        assert_eq!(
            consumers.prefetch(6, 1),
            Swap::Replace {
                prefetch: 6,
                retire: true
            }
        );
        consumers.opened();
        assert!(consumers.may_deliver());
        assert_eq!(consumers.current_ended(0), Swap::Keep);
        assert!(!consumers.all_ended(), "the replaced one still delivers");
        consumers.retired_ended();
        assert!(consumers.all_ended());
    }

    #[test]
    fn a_lower_prefetch_waits_for_the_last_deliveries_and_fewer_held() {
        let mut consumers = Consumers::new(8);
        assert_eq!(consumers.prefetch(2, 5), Swap::Cancel);
        assert_eq!(
            consumers.settled(1),
            Swap::Keep,
            "the cancelled one may still deliver"
        );
        assert_eq!(
            consumers.current_ended(3),
            Swap::Keep,
            "three held, two wanted"
        );
        assert!(!consumers.all_ended(), "a consumer is due");
        assert_eq!(
            consumers.prefetch(4, 3),
            Swap::Open { prefetch: 4 },
            "a newer prefetch counts"
        );
        consumers.opened();
        assert!(consumers.may_deliver());
        assert_eq!(
            consumers.prefetch(4, 0),
            Swap::Cancel,
            "not higher: the same again"
        );
    }

    #[test]
    fn stopping_cancels_once_and_forgets_a_consumer_due() {
        let mut consumers = Consumers::new(8);
        assert_eq!(consumers.prefetch(2, 5), Swap::Cancel);
        assert_eq!(consumers.stop(), Swap::Keep, "already cancelled");
        assert_eq!(
            consumers.current_ended(0),
            Swap::Keep,
            "none opened after a stop"
        );
        assert!(consumers.all_ended());
        assert_eq!(
            consumers.prefetch(9, 0),
            Swap::Keep,
            "stopped: no new consumer"
        );
        let mut fresh = Consumers::new(1);
        assert_eq!(fresh.stop(), Swap::Cancel);
        assert_eq!(fresh.stop(), Swap::Keep);
    }
}
