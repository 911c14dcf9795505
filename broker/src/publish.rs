//! Publishing with confirms: a message counts as sent once the broker has it.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use lapin::{
    BasicProperties, Channel, Confirmation, PublisherConfirm,
    options::BasicPublishOptions,
    types::{AMQPValue, FieldTable},
};

use crate::{
    BrokerError,
    codec::{MSGPACK, encode},
    error::{fits, short},
    topology::{DEAD_QUEUE, EVENTS_EXCHANGE},
};
use gleaner_protocol::{Message, now_ms};

/// Times a nacked message is sent again before the nack is an error.
const NACK_RETRIES: u32 = 4;

/// Persistent delivery mode: queued messages survive a broker restart.
const PERSISTENT: u8 = 2;

/// A channel in confirm mode, stamping every message with who sent it and
/// what it is. Clones share the channel.
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
    identity: Arc<str>,
    /// The connection's broker user, as `user_id` (the broker refuses a
    /// message whose `user_id` is not the connection's user).
    user: Arc<str>,
    sequence: Arc<AtomicU64>,
}

/// Extra AMQP properties for a message that answers another.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
}

impl Reply {
    /// Where the sender of a message with these properties waits.
    pub fn of(properties: &BasicProperties) -> Self {
        Self {
            correlation_id: properties.correlation_id().as_ref().map(|s| s.to_string()),
            reply_to: properties.reply_to().as_ref().map(|s| s.to_string()),
        }
    }

    /// The asker waits on RabbitMQ's direct reply-to, the only address
    /// the services answer: a `reply_to` naming a queue would have them
    /// post into it for whoever asked.
    pub fn is_direct(&self) -> bool {
        self.reply_to
            .as_deref()
            .is_some_and(|to| to.starts_with("amq.rabbitmq.reply-to"))
    }
}

impl Publisher {
    pub(crate) fn new(channel: Channel, identity: Arc<str>, user: Arc<str>) -> Self {
        Self {
            channel,
            identity,
            user,
            sequence: Arc::default(),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    fn properties(&self, kind: &str) -> BasicProperties {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        BasicProperties::default()
            .with_content_type(MSGPACK.into())
            .with_type(kind.into())
            .with_app_id(self.identity.as_ref().into())
            .with_user_id(self.user.as_ref().into())
            .with_message_id(format!("{}/{n}", self.identity).into())
            .with_timestamp(now_ms() / 1000)
    }

    /// The fingerprint its receiver reads of `msg` sent by this publisher
    /// ([`Raw::fingerprint`](crate::Raw::fingerprint)): how a sender
    /// knows its own submission in a refusal.
    pub fn fingerprint<M: Message>(&self, msg: &M) -> Result<u64, BrokerError> {
        crate::submission::fingerprint_of(&self.identity, msg)
    }

    async fn start<M: Message>(
        &self,
        exchange: &str,
        routing_key: &str,
        msg: &M,
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<PublisherConfirm, BrokerError> {
        let body = encode(&self.identity, msg).map_err(|e| BrokerError::Encode(e.to_string()))?;
        fits(msg.kind(), body.len())?;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        Ok(self
            .channel
            .basic_publish(
                short(exchange)?,
                short(routing_key)?,
                options,
                &body,
                properties,
            )
            .await?)
    }

    /// Sends `msg` to `queue` and waits for the broker to confirm it. A queue
    /// that does not exist is an error ([`BrokerError::NoQueue`]), not a
    /// silent drop.
    /// A nack (the broker could not store it: a quorum queue just
    /// declared and not ready yet, say) is answered by sending it again, a
    /// few times, with a growing pause.
    pub async fn send<M: Message>(&self, queue: &str, msg: &M) -> Result<(), BrokerError> {
        self.send_via(("", queue), msg).await
    }

    async fn publish_once<M: Message>(
        &self,
        (exchange, key): (&str, &str),
        msg: &M,
    ) -> Result<(), BrokerError> {
        let properties = self.properties(msg.kind()).with_delivery_mode(PERSISTENT);
        let confirm = self.start(exchange, key, msg, properties, true).await?;
        check(confirm.await?, key)
    }

    /// [`Publisher::send`] through a named exchange: how users reach
    /// gleaner, since write permission on the default exchange would let
    /// them into every queue. Unroutable is an error, as for `send`.
    pub async fn send_via<M: Message>(
        &self,
        (exchange, key): (&str, &str),
        msg: &M,
    ) -> Result<(), BrokerError> {
        let mut pause = std::time::Duration::from_millis(100);
        for _ in 0..NACK_RETRIES {
            match self.publish_once((exchange, key), msg).await {
                Err(BrokerError::Nacked(_)) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                sent => return sent,
            }
        }
        self.publish_once((exchange, key), msg).await
    }

    /// Sends to a queue that may be gone (a job that ended, a launcher that
    /// left, a cluster without a kcm): `false` when it is, which is news,
    /// not a failure.
    pub async fn deliver<M: Message>(&self, queue: &str, msg: &M) -> Result<bool, BrokerError> {
        self.deliver_via(("", queue), msg).await
    }

    /// [`Publisher::deliver`] of a request to be answered by whoever takes
    /// it: it carries the asker's reply address (`reply`), so the answer
    /// goes to the asker, not to this sender.
    pub async fn deliver_answerable<M: Message>(
        &self,
        queue: &str,
        msg: &M,
        reply: &Reply,
    ) -> Result<bool, BrokerError> {
        let mut properties = self.properties(msg.kind()).with_delivery_mode(PERSISTENT);
        if let Some(to) = &reply.reply_to {
            properties = properties.with_reply_to(to.as_str().into());
        }
        if let Some(id) = &reply.correlation_id {
            properties = properties.with_correlation_id(id.as_str().into());
        }
        let confirm = self.start("", queue, msg, properties, true).await?;
        match check(confirm.await?, queue) {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// [`Publisher::deliver`] through a named exchange (one that is gone
    /// counts as a queue that is gone).
    pub async fn deliver_via<M: Message>(
        &self,
        route: (&str, &str),
        msg: &M,
    ) -> Result<bool, BrokerError> {
        match self.send_via(route, msg).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// [`Publisher::deliver`] for many messages, pipelined: one `bool` per
    /// message, `false` where its queue is gone.
    pub async fn deliver_all<M: Message>(
        &self,
        mail: &[(String, M)],
    ) -> Result<Vec<bool>, BrokerError> {
        let mut pending = Vec::with_capacity(mail.len());
        for (queue, msg) in mail {
            let properties = self.properties(msg.kind()).with_delivery_mode(PERSISTENT);
            pending.push(self.start("", queue, msg, properties, true).await?);
        }
        let mut delivered = Vec::with_capacity(mail.len());
        for (confirm, (queue, _)) in pending.into_iter().zip(mail) {
            delivered.push(match check(confirm.await?, queue) {
                Ok(()) => true,
                Err(e) if e.is_not_found() => false,
                Err(e) => return Err(e),
            });
        }
        Ok(delivered)
    }

    /// Sends every message to `queue`, pipelined, and waits for all confirms.
    pub async fn send_all<'a, M: Message + 'a>(
        &self,
        queue: &str,
        msgs: impl IntoIterator<Item = &'a M>,
    ) -> Result<(), BrokerError> {
        let mut pending = Vec::new();
        for msg in msgs {
            let properties = self.properties(msg.kind()).with_delivery_mode(PERSISTENT);
            pending.push(self.start("", queue, msg, properties, true).await?);
        }
        for confirm in pending {
            check(confirm.await?, queue)?;
        }
        Ok(())
    }

    /// Answers a request that carried `reply_to` (e.g. the direct reply-to
    /// pseudo-queue); the reply is transient.
    pub async fn reply<M: Message>(&self, reply: &Reply, msg: &M) -> Result<(), BrokerError> {
        let Some(reply_to) = &reply.reply_to else {
            return Ok(());
        };
        let mut properties = self.properties(msg.kind());
        if let Some(id) = &reply.correlation_id {
            properties = properties.with_correlation_id(id.as_str().into());
        }
        let confirm = self.start("", reply_to, msg, properties, false).await?;
        check(confirm.await?, reply_to)
    }

    /// Sends a request through `exchange` with `key`, expecting an answer
    /// on `reply_to`.
    pub async fn request<M: Message>(
        &self,
        (exchange, key): (&str, &str),
        msg: &M,
        reply: &Reply,
    ) -> Result<(), BrokerError> {
        let mut properties = self.properties(msg.kind());
        if let Some(to) = &reply.reply_to {
            properties = properties.with_reply_to(to.as_str().into());
        }
        if let Some(id) = &reply.correlation_id {
            properties = properties.with_correlation_id(id.as_str().into());
        }
        let confirm = self.start(exchange, key, msg, properties, true).await?;
        check(confirm.await?, key)
    }

    /// Publishes an event on `gleaner.events`. Events are for watchers: nobody
    /// listening is fine, and they are not persisted.
    pub async fn event(&self, event: &gleaner_protocol::Event) -> Result<(), BrokerError> {
        let key = event.routing_key();
        let properties = self.properties(event.kind());
        let confirm = self
            .start(EVENTS_EXCHANGE, &key, event, properties, false)
            .await?;
        check(confirm.await?, EVENTS_EXCHANGE)
    }

    /// Copies an unusable delivery (its properties and body) to
    /// `gleaner.dead` with the reason and its origin in headers, so an
    /// operator can see why it was refused. What the copy carries besides
    /// its body is bounded ([`dead_letter_headers`]): a header frame over the
    /// connection's `frame_max` would close this service's connection, and
    /// the delivery, unacked, would come back to do it again.
    pub async fn dead_letter(
        &self,
        from_queue: &str,
        (original, data): (&BasicProperties, &[u8]),
        reason: &str,
    ) -> Result<(), BrokerError> {
        let headers = dead_letter_headers(
            original.headers().as_ref(),
            reason,
            from_queue,
            &self.identity,
            original.user_id().as_ref().map(|u| u.as_str()),
        );
        // The sender's `user_id` is not this connection's user, so the
        // broker would refuse the copy: it moved to a header. Its other
        // properties are short strings and numbers, bounded by AMQP.
        let properties = original
            .clone()
            .with_user_id(self.user.as_ref().into())
            .with_headers(headers)
            .with_delivery_mode(PERSISTENT);
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                DEAD_QUEUE.into(),
                BasicPublishOptions::default(),
                data,
                properties,
            )
            .await?;
        check(confirm.await?, DEAD_QUEUE)
    }
}

/// The sender's headers that a dead letter keeps: scalars and strings of at
/// most this many bytes, …
const KEPT_HEADER_BYTES: usize = 256;
/// … and this many of them; the rest are counted in `x-gleaner-dropped-headers`.
const KEPT_HEADERS: usize = 32;

/// The headers of a dead letter: the sender's that are small (see
/// [`KEPT_HEADER_BYTES`]), the reason cut to [`gleaner_protocol::REASON_BYTES`],
/// the queue it came from, who refused it and who sent it. At most a few
/// KiB whatever the sender put in the original.
pub fn dead_letter_headers(
    original: Option<&FieldTable>,
    reason: &str,
    from_queue: &str,
    rejected_by: &str,
    sender: Option<&str>,
) -> FieldTable {
    let small = |value: &AMQPValue| match value {
        AMQPValue::LongString(text) => text.len() <= KEPT_HEADER_BYTES,
        AMQPValue::ShortString(text) => text.as_str().len() <= KEPT_HEADER_BYTES,
        AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_) | AMQPValue::ByteArray(_) => false,
        _ => true,
    };
    let mut headers = FieldTable::default();
    let mut dropped = 0u32;
    for (name, value) in original.map(|t| t.inner().iter()).into_iter().flatten() {
        if name.as_str().starts_with("x-gleaner-") {
            continue;
        }
        if headers.inner().len() < KEPT_HEADERS && small(value) {
            headers.insert(name.clone(), value.clone());
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        headers.insert(
            "x-gleaner-dropped-headers".into(),
            AMQPValue::LongUInt(dropped),
        );
    }
    let mut text = |name: &str, value: &str| {
        let value = gleaner_protocol::cut_reason(value);
        headers.insert(name.into(), AMQPValue::LongString(value.as_ref().into()));
    };
    text("x-gleaner-reason", reason);
    text("x-gleaner-queue", from_queue);
    text("x-gleaner-rejected-by", rejected_by);
    if let Some(user) = sender {
        text("x-gleaner-user", user);
    }
    headers
}

fn check(confirmation: Confirmation, queue: &str) -> Result<(), BrokerError> {
    match confirmation {
        Confirmation::Nack(_) => Err(BrokerError::Nacked(queue.to_owned())),
        confirmation => match confirmation.take_message() {
            Some(_returned) => Err(BrokerError::NoQueue(queue.to_owned())),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound on a header table's encoded size: a name and a type octet
    /// each, and each value's own bytes.
    fn encoded_bytes(table: &FieldTable) -> usize {
        table
            .inner()
            .iter()
            .map(|(name, value)| {
                2 + name.as_str().len()
                    + match value {
                        AMQPValue::LongString(text) => 4 + text.len(),
                        AMQPValue::ShortString(text) => 1 + text.as_str().len(),
                        AMQPValue::FieldTable(inner) => 4 + encoded_bytes(inner),
                        _ => 8,
                    }
            })
            .sum()
    }

    #[test]
    fn a_dead_letters_headers_stay_small_whatever_the_sender_put_in_them() {
        let huge = "h".repeat(200_000);
        let mut original = FieldTable::default();
        original.insert("big".into(), AMQPValue::LongString(huge.as_str().into()));
        let mut nested = FieldTable::default();
        nested.insert("deep".into(), AMQPValue::LongString(huge.as_str().into()));
        original.insert("nested".into(), AMQPValue::FieldTable(nested));
        original.insert(
            "x-gleaner-reason".into(),
            AMQPValue::LongString("forged".into()),
        );
        for n in 0..100 {
            original.insert(format!("h{n:03}").into(), AMQPValue::LongLongInt(n));
        }
        assert!(encoded_bytes(&original) > 400_000);
        let reason = format!("unknown field `{huge}`");
        let headers = dead_letter_headers(
            Some(&original),
            &reason,
            "gleaner.submit",
            "runner@h",
            Some("bob"),
        );
        assert!(
            encoded_bytes(&headers) < 16 << 10,
            "{}",
            encoded_bytes(&headers)
        );
        let text = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(text)) => {
                String::from_utf8_lossy(text.as_bytes()).into_owned()
            }
            other => panic!("{name}: {other:?}"),
        };
        assert!(text("x-gleaner-reason").starts_with("unknown field `hhh"));
        assert!(text("x-gleaner-reason").len() <= gleaner_protocol::REASON_BYTES);
        assert_eq!(text("x-gleaner-user"), "bob");
        assert_eq!(text("x-gleaner-queue"), "gleaner.submit");
        assert!(matches!(
            headers.inner().get("x-gleaner-dropped-headers"),
            Some(AMQPValue::LongUInt(n)) if *n as usize == 2 + 100 - KEPT_HEADERS
        ));
        assert!(headers.inner().contains_key("h000"));
    }
}
