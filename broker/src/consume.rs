//! Consuming: typed deliveries with manual acks, and undecodable ones
//! dead-lettered instead of crashing anyone.

use std::marker::PhantomData;

use futures_util::StreamExt;
use lapin::{
    Acker, Channel, Consumer,
    options::{
        BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicQosOptions,
        BasicRejectOptions,
    },
    types::FieldTable,
};
use tracing::warn;

use crate::{
    BrokerError,
    codec::{Decode, DecodeError},
    error::short,
    publish::Publisher,
};
use gleaner_protocol::{Event, MAX_MESSAGE_BYTES};

/// Reads the oldest message of `queue` and leaves it there (it is
/// requeued): state kept in a queue for whoever needs it next. One that
/// cannot be read is dropped, with a warning, and reads as none.
pub async fn peek<M: Decode>(channel: &Channel, queue: &str) -> Result<Option<M>, BrokerError> {
    let Some(got) = channel
        .basic_get(short(queue)?, BasicGetOptions { no_ack: false })
        .await?
    else {
        return Ok(None);
    };
    let delivery = got.delivery;
    match M::decode(&delivery.properties, &delivery.data) {
        Ok((_, msg)) => {
            delivery
                .acker
                .reject(BasicRejectOptions { requeue: true })
                .await?;
            Ok(Some(msg))
        }
        Err(e) => {
            warn!(queue, error = %e, "dropping a message that cannot be read");
            delivery.acker.ack(BasicAckOptions::default()).await?;
            Ok(None)
        }
    }
}

/// Takes up to `limit` messages out of `queue`, each with the address its
/// sender asked to be answered at; those that cannot be read are dropped.
/// For a queue about to be deleted, whose senders should hear why.
pub async fn take_all<M: Decode>(
    channel: &Channel,
    queue: &str,
    limit: usize,
) -> Result<Vec<(M, crate::publish::Reply)>, BrokerError> {
    let mut taken = Vec::new();
    while taken.len() < limit {
        let Some(got) = channel
            .basic_get(short(queue)?, BasicGetOptions { no_ack: true })
            .await?
        else {
            break;
        };
        let properties = &got.delivery.properties;
        if let Ok((_, msg)) = M::decode(properties, &got.delivery.data) {
            taken.push((msg, crate::publish::Reply::of(properties)));
        }
    }
    Ok(taken)
}

/// How to consume a queue.
#[derive(Debug, Clone)]
pub struct ConsumeOptions<'a> {
    /// The consumer tag, shown in the management UI (`launcher@host/3`).
    pub tag: &'a str,
    /// Unacked deliveries this consumer may hold at once.
    pub prefetch: u16,
    /// No other consumer may consume the queue while this one does.
    pub exclusive: bool,
}

/// A typed stream of deliveries from one queue.
pub struct Inbox<M> {
    queue: String,
    tag: String,
    channel: Channel,
    consumer: Consumer,
    publisher: Publisher,
    /// Bytes a delivery may have; a larger one is dead-lettered unread.
    limit: usize,
    _message: PhantomData<fn() -> M>,
}

/// One delivery, decoded. Ack it once its effects are safe.
pub struct Incoming<M> {
    pub msg: M,
    /// The sender named in the envelope.
    pub from: String,
    /// The broker user who sent it (`user_id`, which the broker checks
    /// against the sending connection), if the sender set it.
    pub user: Option<String>,
    pub redelivered: bool,
    /// When it was sent (its `timestamp`, in seconds), if it says.
    pub sent_at: Option<u64>,
    pub reply: crate::publish::Reply,
    acker: Acker,
    delivery_tag: u64,
}

/// Acks a delivery whose message has been handed on.
#[derive(Debug, Clone)]
pub struct Receipt {
    acker: Acker,
}

impl Receipt {
    /// Acks the delivery alone.
    pub async fn ack(&self) -> Result<(), BrokerError> {
        self.acker.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// Acks the delivery and every earlier unacked one of the same channel.
    pub async fn ack_up_to_here(&self) -> Result<(), BrokerError> {
        self.acker.ack(BasicAckOptions { multiple: true }).await?;
        Ok(())
    }
}

impl<M> Incoming<M> {
    pub async fn ack(&self) -> Result<(), BrokerError> {
        self.receipt().ack().await
    }

    /// Acks this delivery and every earlier unacked one of the same channel.
    pub async fn ack_up_to_here(&self) -> Result<(), BrokerError> {
        self.receipt().ack_up_to_here().await
    }

    /// What acks this delivery, kept apart from its message.
    pub fn receipt(&self) -> Receipt {
        Receipt {
            acker: self.acker.clone(),
        }
    }

    /// Returns the delivery to its queue (its delivery count goes up).
    pub async fn requeue(&self) -> Result<(), BrokerError> {
        self.acker
            .reject(BasicRejectOptions { requeue: true })
            .await?;
        Ok(())
    }

    pub fn delivery_tag(&self) -> u64 {
        self.delivery_tag
    }
}

impl<M: Decode> Inbox<M> {
    /// Starts consuming `queue` on `channel`; undecodable deliveries are sent
    /// to `gleaner.dead` through `publisher`.
    pub async fn open(
        channel: &Channel,
        publisher: Publisher,
        queue: &str,
        options: ConsumeOptions<'_>,
    ) -> Result<Self, BrokerError> {
        Self::open_with(channel, publisher, queue, options, FieldTable::default()).await
    }

    /// Reads the stream `queue` from its first message on; each delivery
    /// must still be acked (it gives the consumer credit for the next).
    pub async fn read_stream(
        channel: &Channel,
        publisher: Publisher,
        queue: &str,
        options: ConsumeOptions<'_>,
    ) -> Result<Self, BrokerError> {
        let mut from_first = FieldTable::default();
        from_first.insert(
            "x-stream-offset".into(),
            lapin::types::AMQPValue::LongString("first".into()),
        );
        Self::open_with(channel, publisher, queue, options, from_first).await
    }

    async fn open_with(
        channel: &Channel,
        publisher: Publisher,
        queue: &str,
        options: ConsumeOptions<'_>,
        arguments: FieldTable,
    ) -> Result<Self, BrokerError> {
        channel
            .basic_qos(options.prefetch, BasicQosOptions { global: false })
            .await?;
        let consumer = channel
            .basic_consume(
                short(queue)?,
                short(options.tag)?,
                BasicConsumeOptions {
                    exclusive: options.exclusive,
                    ..BasicConsumeOptions::default()
                },
                arguments,
            )
            .await?;
        Ok(Self {
            queue: queue.to_owned(),
            tag: options.tag.to_owned(),
            channel: channel.clone(),
            consumer,
            publisher,
            limit: MAX_MESSAGE_BYTES,
            _message: PhantomData,
        })
    }

    /// Takes deliveries of at most `bytes` (the default is the most any
    /// gleaner message has, [`MAX_MESSAGE_BYTES`]): with the prefetch, what
    /// this consumer can be made to hold.
    pub fn limited(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// A new consumer of the same queue, on the same channel, that may hold
    /// `prefetch` unacked deliveries: RabbitMQ cannot change a consumer's
    /// prefetch, so the caller then [`Inbox::stop`]s this one and reads
    /// what it still delivers. Deliveries of both are acked alike.
    pub async fn reopen(&self, tag: &str, prefetch: u16) -> Result<Self, BrokerError> {
        let options = ConsumeOptions {
            tag,
            prefetch,
            exclusive: false,
        };
        Self::open(&self.channel, self.publisher.clone(), &self.queue, options).await
    }

    /// Asks the broker for no more deliveries. Those already sent still come
    /// out of [`Inbox::next`], which then returns `None`.
    pub async fn stop(&self) -> Result<(), BrokerError> {
        self.channel
            .basic_cancel(self.tag.as_str().into(), BasicCancelOptions::default())
            .await?;
        Ok(())
    }

    /// The next decodable delivery. `None` once the consumer is cancelled
    /// (the queue was deleted); `Some(Err)` when the channel or connection
    /// failed. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Incoming<M>, BrokerError>> {
        loop {
            let delivery = match self.consumer.next().await? {
                Ok(delivery) => delivery,
                Err(e) => return Some(Err(e.into())),
            };
            let decoded = if delivery.data.len() > self.limit {
                Err(DecodeError::TooBig {
                    bytes: delivery.data.len(),
                    limit: self.limit,
                })
            } else {
                M::decode(&delivery.properties, &delivery.data)
            };
            match decoded {
                Ok((from, msg)) => {
                    return Some(Ok(Incoming {
                        msg,
                        from,
                        user: delivery
                            .properties
                            .user_id()
                            .as_ref()
                            .map(|u| u.to_string()),
                        redelivered: delivery.redelivered,
                        sent_at: *delivery.properties.timestamp(),
                        reply: crate::publish::Reply::of(&delivery.properties),
                        acker: delivery.acker.clone(),
                        delivery_tag: delivery.delivery_tag,
                    }));
                }
                Err(e) => {
                    if let Err(e) = self.reject(&delivery, &e).await {
                        return Some(Err(e));
                    }
                }
            }
        }
    }

    /// Sends a delivery this component cannot use to `gleaner.dead` with the reason.
    async fn reject(
        &self,
        delivery: &lapin::message::Delivery,
        error: &DecodeError,
    ) -> Result<(), BrokerError> {
        let reason = error.to_string();
        let reason = reason.as_str();
        warn!(
            queue = %self.queue,
            reason,
            kind = ?delivery.properties.kind(),
            app_id = ?delivery.properties.app_id(),
            message_id = ?delivery.properties.message_id(),
            content_type = ?delivery.properties.content_type(),
            bytes = delivery.data.len(),
            "undecodable message dead-lettered"
        );
        // A message too big for its queue is not copied whole anywhere.
        let body = match error {
            DecodeError::TooBig { .. } => &[][..],
            _ => &delivery.data[..],
        };
        match self
            .publisher
            .dead_letter(&self.queue, (&delivery.properties, body), reason)
            .await
        {
            Ok(()) => {
                delivery.acker.ack(BasicAckOptions::default()).await?;
                if let DecodeError::Invalid { job: Some(job), .. } = error {
                    let event = Event::Rejected {
                        job: job.clone(),
                        owner: delivery
                            .properties
                            .user_id()
                            .as_ref()
                            .map(|u| u.to_string())
                            .unwrap_or_default(),
                        reason: reason.to_owned(),
                        submission: Some(crate::submission::fingerprint(&delivery.data)),
                        live_job: false,
                    };
                    if let Err(e) = self.publisher.event(&event).await {
                        warn!(job = %job, error = %e, "cannot publish the rejection event");
                    }
                }
            }
            Err(e) => {
                warn!(queue = %self.queue, error = %e, "cannot copy to gleaner.dead; rejecting instead");
                delivery
                    .acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await?;
            }
        }
        Ok(())
    }
}
