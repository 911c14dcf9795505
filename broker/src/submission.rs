//! Manifests as they arrive on `gleaner.submit`: enveloped MessagePack from
//! `gleaner submit`, or bare JSON published by hand.

use gleaner_manifest::{JobId, Manifest};
use lapin::BasicProperties;

use crate::codec::{Decode, DecodeError, JSON, MSGPACK, decode};
use gleaner_protocol::{Submission, now_ms};

/// A submission that decoded and whose manifest is valid, with the
/// delivery as it came, should the runner refuse it
/// ([`Publisher::dead_letter`](crate::Publisher::dead_letter)).
#[derive(Debug, Clone)]
pub struct IncomingSubmission(pub Submission, pub Raw);

/// A delivery's properties and body, kept to be dead-lettered as they came.
#[derive(Debug, Clone)]
pub struct Raw {
    pub properties: BasicProperties,
    pub data: Vec<u8>,
}

impl Raw {
    /// A fingerprint of the body: the same for a redelivery of this
    /// message, another for any other submission.
    pub fn fingerprint(&self) -> u64 {
        fingerprint(&self.data)
    }

    fn of(properties: &BasicProperties, data: &[u8]) -> Self {
        Self {
            properties: properties.clone(),
            data: data.to_vec(),
        }
    }
}

impl Decode for IncomingSubmission {
    fn decode(properties: &BasicProperties, data: &[u8]) -> Result<(String, Self), DecodeError> {
        let content_type = properties.content_type().as_ref().map(|c| c.as_str());
        match content_type {
            Some(JSON) => decode_json(properties, data),
            None | Some(MSGPACK) => {
                let envelope = decode::<Submission>(data)?;
                envelope
                    .msg
                    .manifest
                    .validate()
                    .map_err(|e| DecodeError::Invalid {
                        job: Some(envelope.msg.job.to_string()),
                        reason: gleaner_protocol::cut_reason(&format!("invalid manifest: {e}"))
                            .into_owned(),
                    })?;
                Ok((envelope.from, Self(envelope.msg, Raw::of(properties, data))))
            }
            Some(other) => Err(DecodeError::ContentType(format!(
                "{other} (manifests are {MSGPACK} or {JSON})"
            ))),
        }
    }
}

fn decode_json(
    properties: &BasicProperties,
    data: &[u8],
) -> Result<(String, IncomingSubmission), DecodeError> {
    let from = properties
        .app_id()
        .as_ref()
        .map_or_else(|| "manual".to_owned(), |a| a.to_string());
    let manifest = Manifest::from_json(data).map_err(|e| DecodeError::Invalid {
        job: json_name(data).map(|name| job_id_for(properties, &name, data).to_string()),
        reason: gleaner_protocol::cut_reason(&format!("invalid manifest: {e}")).into_owned(),
    })?;
    let job = job_id_for(properties, &manifest.name, data);
    let submitted_at = properties
        .timestamp()
        .map_or_else(now_ms, |seconds| seconds.saturating_mul(1000));
    Ok((
        from,
        IncomingSubmission(
            Submission {
                job,
                manifest,
                submitted_at,
            },
            Raw::of(properties, data),
        ),
    ))
}

fn json_name(data: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    let name = value.get("name")?.as_str()?;
    let probe = JobId::new(name, 0);
    probe
        .to_string()
        .parse::<JobId>()
        .ok()
        .map(|_| name.to_owned())
}

/// A hand-published manifest is named by its `message_id` when that is a job
/// id, and otherwise by a hash of its sender, body and timestamp, so that a
/// redelivery of the same message resumes the same job. Neither binds the
/// id to its owner: the runner's claim does.
fn job_id_for(properties: &BasicProperties, name: &str, data: &[u8]) -> JobId {
    if let Some(id) = properties
        .message_id()
        .as_ref()
        .and_then(|m| m.as_str().parse::<JobId>().ok())
        .filter(|id| id.name() == name)
    {
        return id;
    }
    let sender = properties.user_id().as_ref().map(|u| u.as_str().as_bytes());
    let mut hash = fnv1a_extend(fnv1a(sender.unwrap_or_default()), data);
    if let Some(timestamp) = properties.timestamp() {
        hash = fnv1a_extend(hash, &timestamp.to_le_bytes());
    }
    JobId::new(name, hash)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The fingerprint of a message's body ([`Raw::fingerprint`], and what
/// [`Publisher::fingerprint`](crate::Publisher::fingerprint) works out
/// before sending).
pub fn fingerprint(body: &[u8]) -> u64 {
    fnv1a(body)
}

/// The fingerprint of `msg`'s body as sent by `from`.
pub(crate) fn fingerprint_of<M: gleaner_protocol::Message>(
    from: &str,
    msg: &M,
) -> Result<u64, crate::BrokerError> {
    let body =
        crate::codec::encode(from, msg).map_err(|e| crate::BrokerError::Encode(e.to_string()))?;
    Ok(fingerprint(&body))
}

fn fnv1a(data: &[u8]) -> u64 {
    fnv1a_extend(FNV_OFFSET, data)
}

fn fnv1a_extend(mut hash: u64, data: &[u8]) -> u64 {
    for byte in data {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode;

    fn json() -> BasicProperties {
        BasicProperties::default().with_content_type(JSON.into())
    }

    #[test]
    fn json_manifests_get_a_stable_id() {
        let body = br#"{"name":"hand","task":[{"command":"true"}]}"#;
        let (_, IncomingSubmission(a, _)) = IncomingSubmission::decode(&json(), body).unwrap();
        let (_, IncomingSubmission(b, _)) = IncomingSubmission::decode(&json(), body).unwrap();
        assert_eq!(a.job, b.job);
        assert_eq!(a.job.name(), "hand");
        let named = json().with_message_id("hand-00000000000beef0".into());
        let (_, IncomingSubmission(c, _)) = IncomingSubmission::decode(&named, body).unwrap();
        assert_eq!(c.job.as_str(), "hand-00000000000beef0");
    }

    #[test]
    fn invalid_json_manifests_name_their_job_when_they_can() {
        let err =
            IncomingSubmission::decode(&json(), br#"{"name":"bad","walltime":"x"}"#).unwrap_err();
        match err {
            DecodeError::Invalid { job, reason } => {
                assert!(job.unwrap().starts_with("bad-"));
                assert!(reason.contains("walltime"), "{reason}");
            }
            other => panic!("{other}"),
        }
        assert!(IncomingSubmission::decode(&json(), b"not json").is_err());
    }

    #[test]
    fn msgpack_submissions_are_validated_again() {
        let mut manifest =
            Manifest::from_toml("name = \"m\"\n[[task]]\ncommand = \"true\"\n").unwrap();
        let job = JobId::new("m", 1);
        let ok = Submission {
            job: job.clone(),
            manifest: manifest.clone(),
            submitted_at: 1,
        };
        let body = encode("cli", &ok).unwrap();
        let (from, IncomingSubmission(s, raw)) =
            IncomingSubmission::decode(&BasicProperties::default(), &body).unwrap();
        assert_eq!((from.as_str(), s.job), ("cli", job.clone()));
        assert_eq!(
            fingerprint_of("cli", &ok).unwrap(),
            raw.fingerprint(),
            "its sender knows it in a refusal"
        );
        let again = Submission {
            submitted_at: 2,
            ..ok.clone()
        };
        assert_ne!(fingerprint_of("cli", &again).unwrap(), raw.fingerprint());
        manifest.max_attempts = 0;
        let bad = Submission {
            job,
            manifest,
            submitted_at: 1,
        };
        let body = encode("cli", &bad).unwrap();
        assert!(matches!(
            IncomingSubmission::decode(&BasicProperties::default(), &body),
            Err(DecodeError::Invalid { job: Some(_), .. })
        ));
    }

    /// What `gleaner submit` refuses, a runner refuses on receipt too: a
    /// hand-made submission skips the CLI.
    #[test]
    fn a_submission_whose_task_is_too_heavy_for_a_message_is_refused_on_receipt() {
        let long = "v".repeat(100_000);
        let uses = "{x} ".repeat(200);
        let body = format!(
            r#"{{"name":"heavy","sweep":{{"command":"echo {uses}","params":{{"x":["a","{long}"]}}}}}}"#
        );
        match IncomingSubmission::decode(&json(), body.as_bytes()).unwrap_err() {
            DecodeError::Invalid { job, reason } => {
                assert!(job.unwrap().starts_with("heavy-"));
                assert!(reason.contains("task 1 would take 19.2 MiB"), "{reason}");
            }
            other => panic!("{other}"),
        }
    }
}
