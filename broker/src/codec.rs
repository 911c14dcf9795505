//! Deliveries into messages: the AMQP content type decides how a body is read.

use lapin::BasicProperties;

use gleaner_protocol::Message;
pub use gleaner_protocol::codec::{DecodeError, JSON, MSGPACK, decode, encode};

/// Something a delivery can be turned into: an enveloped message, or a type
/// with its own rules (a submission may be JSON published by hand).
pub trait Decode: Sized + Send {
    fn decode(properties: &BasicProperties, data: &[u8]) -> Result<(String, Self), DecodeError>;
}

impl<M: Message> Decode for M {
    fn decode(properties: &BasicProperties, data: &[u8]) -> Result<(String, Self), DecodeError> {
        if let Some(content_type) = properties.content_type()
            && content_type.as_str() != MSGPACK
        {
            return Err(DecodeError::ContentType(content_type.to_string()));
        }
        let envelope = decode::<M>(data)?;
        Ok((envelope.from, envelope.msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_protocol::{KcmMsg, LauncherMsg};

    #[test]
    fn other_content_types_are_refused() {
        let body = encode("x", &LauncherMsg::Drain { reason: "r".into() }).unwrap();
        let json = BasicProperties::default().with_content_type(JSON.into());
        assert!(matches!(
            <KcmMsg as Decode>::decode(&json, &body),
            Err(DecodeError::ContentType(_))
        ));
    }
}
