//! How results are packed into messages: each message costs the broker a
//! write to its quorum log, a delivery and an ack whatever it holds, so
//! results that come together travel together, up to a count and a size.

/// Results in one message at most.
pub const RESULTS_PER_MESSAGE: usize = 64;
/// Weight ([`gleaner_protocol::ResultMsg::weight`]) of one message,
/// unless its one result alone has more: a run with more output goes in
/// parts first, so that a message is at most this and one run's paths.
pub const BYTES_PER_MESSAGE: usize = gleaner_protocol::RESULT_MESSAGE_BYTES;

/// The message being packed, and whether the next one waits for more.
#[derive(Debug, Default)]
pub struct Packer {
    count: usize,
    bytes: usize,
    /// The last message held more than one result: they come fast.
    linger: bool,
}

impl Packer {
    /// A message starts with its first result, of `size` bytes of output.
    pub fn start(&mut self, size: usize) {
        self.count = 1;
        self.bytes = size;
    }

    /// Whether the message has room for another result at all.
    pub fn has_room(&self) -> bool {
        self.count < RESULTS_PER_MESSAGE
    }

    /// Takes a result of `size` bytes if it fits; one that does not starts
    /// the next message.
    pub fn take(&mut self, size: usize) -> bool {
        let bytes = self.bytes.saturating_add(size);
        if !self.has_room() || bytes > BYTES_PER_MESSAGE {
            return false;
        }
        self.count += 1;
        self.bytes = bytes;
        true
    }

    /// Whether the message waits a moment for more when none is ready:
    /// only while results come faster than one per message. A lone result
    /// waits for no other.
    pub fn lingers(&self) -> bool {
        self.linger
    }

    /// The message is sent.
    pub fn sent(&mut self) {
        self.linger = self.count > 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_wait_for_more_only_while_results_come_together() {
        let mut packer = Packer::default();
        packer.start(10);
        assert!(!packer.lingers(), "a lone result goes at once");
        packer.sent();
        assert!(!packer.lingers());
        packer.start(10);
        assert!(packer.take(10));
        packer.sent();
        assert!(packer.lingers(), "two came together: the next waits");
        packer.start(10);
        packer.sent();
        assert!(!packer.lingers());
    }

    #[test]
    fn a_message_holds_so_many_results_and_so_many_bytes() {
        let mut packer = Packer::default();
        packer.start(0);
        for _ in 1..RESULTS_PER_MESSAGE {
            assert!(packer.take(1));
        }
        assert!(!packer.has_room() && !packer.take(1));
        packer.start(BYTES_PER_MESSAGE - 1);
        assert!(packer.take(1));
        assert!(!packer.take(1), "over the bytes: the next message");
    }
}
