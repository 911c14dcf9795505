//! For clients: watching events, and asking a service a question.

use std::{marker::PhantomData, time::Duration};

use futures_util::StreamExt;
use lapin::{
    options::{BasicConsumeOptions, ConfirmSelectOptions, QueueDeleteOptions},
    types::FieldTable,
};

use crate::{
    BrokerError, Connection, ConsumeOptions, Inbox, Publisher, Reply,
    codec::{Decode, DecodeError},
    topology,
};
use gleaner_protocol::{Event, Message};

/// Requests and every answer to them, on a channel of its own
/// ([`Connection::converse`]).
pub struct Conversation<A> {
    publisher: Publisher,
    answers: lapin::Consumer,
    answer: PhantomData<A>,
}

impl<A: Message> Conversation<A> {
    /// Sends `request` through `exchange` with `key`; its answers come to
    /// [`Conversation::next`].
    pub async fn send<Q: Message>(
        &self,
        route: (&str, &str),
        request: &Q,
        correlation_id: Option<String>,
    ) -> Result<(), BrokerError> {
        let reply = Reply {
            correlation_id,
            reply_to: Some(DIRECT_REPLY_TO.to_owned()),
        };
        self.publisher.request(route, request, &reply).await
    }

    /// The next answer; `None` once the channel closed.
    pub async fn next(&mut self) -> Option<Result<A, BrokerError>> {
        let delivery = match self.answers.next().await? {
            Ok(delivery) => delivery,
            Err(e) => return Some(Err(e.into())),
        };
        Some(decoded(&delivery))
    }
}

/// An answer's message.
fn decoded<A: Message>(delivery: &lapin::message::Delivery) -> Result<A, BrokerError> {
    match A::decode(&delivery.properties, &delivery.data) {
        Ok((_, answer)) => Ok(answer),
        Err(DecodeError::ContentType(t)) => {
            Err(BrokerError::Encode(format!("answer has content type {t}")))
        }
        Err(e) => Err(BrokerError::Encode(e.to_string())),
    }
}

/// RabbitMQ's direct reply-to pseudo-queue: answers come straight back on
/// the asking channel, with no queue to declare or clean up.
const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

impl Connection {
    /// Events whose routing key matches `pattern` from now on, on the
    /// client's own queue `queue` ([`topology::declare_watch`]): consumed
    /// again after a reconnection, it has kept what came meanwhile.
    pub async fn follow(
        &self,
        publisher: &Publisher,
        queue: &str,
        pattern: &str,
        expires: Duration,
    ) -> Result<Inbox<Event>, BrokerError> {
        let channel = self.channel().await?;
        topology::declare_watch(&channel, queue, pattern, expires).await?;
        Inbox::open(
            &channel,
            publisher.clone(),
            queue,
            ConsumeOptions {
                tag: self.identity(),
                prefetch: 64,
                exclusive: false,
            },
        )
        .await
    }

    /// A channel of its own whose requests are answered on its direct
    /// reply-to, any number of times: answers come as they are sent, to
    /// whoever holds it, until it is dropped.
    pub async fn converse<A: Message>(&self) -> Result<Conversation<A>, BrokerError> {
        let channel = self.channel().await?;
        let answers = channel
            .basic_consume(
                DIRECT_REPLY_TO.into(),
                self.identity().into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Conversation {
            publisher: Publisher::new(channel, self.identity.clone(), self.user.clone()),
            answers,
            answer: PhantomData,
        })
    }

    /// Deletes a queue of [`Connection::follow`] that served its purpose;
    /// one that cannot be deleted now expires by itself.
    pub async fn forget(&self, queue: &str) {
        if let Ok(channel) = self.channel().await {
            let _ = channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await;
        }
    }

    /// Sends `request` through `exchange` with `key` and waits up to
    /// `timeout` for the answer; `Ok(None)` if none came.
    pub async fn ask<Q: Message, A: Message>(
        &self,
        route: (&str, &str),
        request: &Q,
        timeout: Duration,
    ) -> Result<Option<A>, BrokerError> {
        let mut conversation = self.converse::<A>().await?;
        let correlation = format!("{}/{}", self.identity(), rand::random::<u64>());
        conversation
            .send(route, request, Some(correlation.clone()))
            .await?;
        let wait = async {
            while let Some(delivery) = conversation.answers.next().await {
                let delivery = delivery?;
                let matches = delivery
                    .properties
                    .correlation_id()
                    .as_ref()
                    .is_some_and(|c| c.as_str() == correlation);
                if matches {
                    return decoded(&delivery).map(Some);
                }
            }
            Ok(None)
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or(Ok(None))
    }
}
