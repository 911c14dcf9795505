//! Bodies on the wire: MessagePack maps in a versioned envelope.

use serde::Serialize;

use crate::{Envelope, MAX_MESSAGE_BYTES, Message, PROTOCOL_VERSION};

pub const MSGPACK: &str = "application/msgpack";
pub const JSON: &str = "application/json";

/// Why a delivery could not be turned into a message. It is never a crash:
/// the delivery goes to `gleaner.dead` with this as its reason.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DecodeError {
    #[error("content type {0:?} is not {MSGPACK}")]
    ContentType(String),
    #[error("undecodable MessagePack body: {0}")]
    Body(String),
    /// The message decoded but is unusable; `job` names the job it was for,
    /// when known, so that a rejection event can be published.
    #[error("{reason}")]
    Invalid { job: Option<String>, reason: String },
    /// Larger than its queue's messages are (the body is not kept).
    #[error("{bytes} bytes, more than the {limit} a message of this queue holds")]
    TooBig { bytes: usize, limit: usize },
}

#[derive(Serialize)]
struct OutgoingEnvelope<'a, M> {
    v: u16,
    from: &'a str,
    msg: &'a M,
}

/// Encodes `msg` from `from` as the body of an AMQP message.
pub fn encode<M: Message>(from: &str, msg: &M) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let envelope = OutgoingEnvelope {
        v: PROTOCOL_VERSION,
        from,
        msg,
    };
    rmp_serde::to_vec_named(&envelope)
}

/// Room a body leaves its envelope for the sender's name: a message whose
/// [`encoded_len`] from no one is this much within [`MAX_MESSAGE_BYTES`]
/// fits whoever sends it.
pub const SENDER_ROOM: usize = 1024;

/// The bytes `msg` from `from` takes as a body, counted as it is encoded
/// rather than held: a service weighs what a user's request would make
/// before it builds the message.
pub fn encoded_len<M: Message>(from: &str, msg: &M) -> Result<usize, rmp_serde::encode::Error> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let envelope = OutgoingEnvelope {
        v: PROTOCOL_VERSION,
        from,
        msg,
    };
    let mut count = Count(0);
    rmp_serde::encode::write_named(&mut count, &envelope)?;
    Ok(count.0)
}

/// Whether `msg` fits one message whoever sends it; if not, its bytes.
pub fn fits<M: Message>(msg: &M) -> Result<(), usize> {
    match encoded_len("", msg) {
        Ok(bytes) if bytes + SENDER_ROOM <= MAX_MESSAGE_BYTES => Ok(()),
        Ok(bytes) => Err(bytes),
        Err(_) => Err(usize::MAX),
    }
}

/// Decodes an enveloped MessagePack body.
pub fn decode<M: Message>(data: &[u8]) -> Result<Envelope<M>, DecodeError> {
    rmp_serde::from_slice(data)
        .map_err(|e| DecodeError::Body(crate::cut_reason(&e.to_string()).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KcmMsg, LauncherMsg};

    #[test]
    fn round_trip_keeps_sender_and_message() {
        let msg = LauncherMsg::Preempt {
            reason: "local job waiting".into(),
        };
        let body = encode("runner@h", &msg).unwrap();
        let envelope = decode::<LauncherMsg>(&body).unwrap();
        assert_eq!(envelope.from, "runner@h");
        assert_eq!(envelope.v, PROTOCOL_VERSION);
        assert!(
            matches!(envelope.msg, LauncherMsg::Preempt { reason } if reason == "local job waiting")
        );
    }

    #[test]
    fn bodies_are_maps_with_field_names() {
        let body = encode("x", &LauncherMsg::Drain { reason: "r".into() }).unwrap();
        let value: serde_json::Value = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(value["msg"]["type"], "drain");
        assert_eq!(value["msg"]["reason"], "r");
    }

    #[test]
    fn a_message_is_weighed_as_it_is_encoded() {
        let msg = LauncherMsg::Drain {
            reason: "r".repeat(1000),
        };
        assert_eq!(
            encoded_len("runner@h", &msg).unwrap(),
            encode("runner@h", &msg).unwrap().len()
        );
        assert!(fits(&msg).is_ok());
        let big = LauncherMsg::Drain {
            reason: "r".repeat(MAX_MESSAGE_BYTES),
        };
        assert!(fits(&big).unwrap_err() > MAX_MESSAGE_BYTES);
    }

    #[test]
    fn garbage_and_wrong_types_are_errors_not_panics() {
        assert!(decode::<KcmMsg>(b"\xc1garbage").is_err());
        let body = encode("x", &LauncherMsg::Drain { reason: "r".into() }).unwrap();
        assert!(decode::<KcmMsg>(&body).is_err());
    }
}
