//! A sink as the Admin API sends it and as the shards store it: defaults
//! filled in, limits checked, so a bad sink is refused with
//! INVALID_ARGUMENT before it reaches any shard.

use floret_proto::v1;
use floret_store::{SinkSpec, SinkTarget};
use tonic::Status;

/// Messages per batch when the request leaves it at zero.
pub const DEFAULT_BATCH_MAX: u32 = 100;
/// Most messages per batch.
pub const MAX_BATCH_MAX: u32 = 10_000;
/// Payload bytes per batch when the request leaves it at zero.
pub const DEFAULT_BATCH_MAX_BYTES: u64 = 1 << 20;
/// Most payload bytes per batch.
pub const MAX_BATCH_MAX_BYTES: u64 = 64 << 20;
/// Linger when the request leaves it at zero, ms.
pub const DEFAULT_LINGER_MS: u32 = 5;
/// Longest linger, ms.
pub const MAX_LINGER_MS: u32 = 60_000;
/// A batch's timeout when the request leaves it at zero, ms.
pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;
/// The highest rate cap, messages/s.
pub const MAX_RATE: u32 = 1_000_000;
/// The highest cap on batches in flight.
pub const MAX_IN_FLIGHT: u32 = 10_000;
/// Shortest and longest timeout of a batch, ms.
pub const TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u32> = 100..=600_000;

/// The sink `wire` asks for, defaults filled in; INVALID_ARGUMENT naming
/// the field that is out of range.
pub fn from_wire(wire: Option<v1::SinkSpec>) -> Result<SinkSpec, Status> {
    let wire = wire.ok_or_else(|| Status::invalid_argument("sink is missing"))?;
    let target = match wire.target {
        Some(v1::sink_spec::Target::Grpc(grpc)) => SinkTarget::Grpc {
            address: http_uri("grpc sink address", &grpc.address, "http://host:port")?,
        },
        Some(v1::sink_spec::Target::Webhook(webhook)) => SinkTarget::Webhook {
            url: http_uri("webhook url", &webhook.url, "http://host:port/path")?,
        },
        Some(v1::sink_spec::Target::Amqp(amqp)) => amqp_target(amqp)?,
        None => {
            return Err(Status::invalid_argument(
                "sink has no target: set grpc { address }, webhook { url } or amqp { uri, exchange, routing_key }",
            ));
        }
    };
    let or_default = |value: u32, default: u32| if value == 0 { default } else { value };
    let batch_max = or_default(wire.batch_max, DEFAULT_BATCH_MAX);
    if batch_max > MAX_BATCH_MAX {
        return Err(Status::invalid_argument(format!(
            "batch_max {batch_max} is over {MAX_BATCH_MAX}"
        )));
    }
    let batch_max_bytes = match wire.batch_max_bytes {
        0 => DEFAULT_BATCH_MAX_BYTES,
        bytes if bytes > MAX_BATCH_MAX_BYTES => {
            return Err(Status::invalid_argument(format!(
                "batch_max_bytes {bytes} is over {MAX_BATCH_MAX_BYTES}"
            )));
        }
        bytes => bytes,
    };
    let linger_ms = or_default(wire.linger_ms, DEFAULT_LINGER_MS);
    if linger_ms > MAX_LINGER_MS {
        return Err(Status::invalid_argument(format!(
            "linger_ms {linger_ms} is over {MAX_LINGER_MS}"
        )));
    }
    let timeout_ms = or_default(wire.timeout_ms, DEFAULT_TIMEOUT_MS);
    if !TIMEOUT_RANGE_MS.contains(&timeout_ms) {
        return Err(Status::invalid_argument(format!(
            "timeout_ms {timeout_ms} is outside {TIMEOUT_RANGE_MS:?}"
        )));
    }
    if wire.rate > MAX_RATE {
        return Err(Status::invalid_argument(format!(
            "rate {} is over {MAX_RATE} messages/s",
            wire.rate
        )));
    }
    if wire.max_in_flight > MAX_IN_FLIGHT {
        return Err(Status::invalid_argument(format!(
            "max_in_flight {} is over {MAX_IN_FLIGHT} batches",
            wire.max_in_flight
        )));
    }
    Ok(SinkSpec {
        target,
        batch_max,
        batch_max_bytes,
        linger_ms,
        timeout_ms,
        rate: wire.rate,
        max_in_flight: wire.max_in_flight,
    })
}

/// The sink as the API shows it.
pub fn to_wire(sink: SinkSpec) -> v1::SinkSpec {
    let target = match sink.target {
        SinkTarget::Grpc { address } => v1::sink_spec::Target::Grpc(v1::GrpcSink { address }),
        SinkTarget::Webhook { url } => v1::sink_spec::Target::Webhook(v1::WebhookSink { url }),
        SinkTarget::Amqp {
            uri,
            exchange,
            routing_key,
        } => v1::sink_spec::Target::Amqp(v1::AmqpSink {
            uri,
            exchange,
            routing_key,
        }),
    };
    v1::SinkSpec {
        target: Some(target),
        batch_max: sink.batch_max,
        batch_max_bytes: sink.batch_max_bytes,
        linger_ms: sink.linger_ms,
        timeout_ms: sink.timeout_ms,
        rate: sink.rate,
        max_in_flight: sink.max_in_flight,
    }
}

/// Longest exchange name or routing key AMQP carries.
const MAX_AMQP_NAME: usize = 255;

/// An AMQP target with a URI lapin reads, and names AMQP can carry.
fn amqp_target(amqp: v1::AmqpSink) -> Result<SinkTarget, Status> {
    if !amqp.uri.starts_with("amqp://") {
        return Err(Status::invalid_argument(format!(
            "amqp uri {:?} does not start with amqp:// (amqps:// is not supported yet)",
            amqp.uri
        )));
    }
    if amqp.uri.parse::<lapin::uri::AMQPUri>().is_err() {
        return Err(Status::invalid_argument(format!(
            "amqp uri {:?} is not amqp://user:password@host:port/vhost",
            amqp.uri
        )));
    }
    for (what, name) in [
        ("exchange", &amqp.exchange),
        ("routing_key", &amqp.routing_key),
    ] {
        if name.len() > MAX_AMQP_NAME {
            return Err(Status::invalid_argument(format!(
                "amqp {what} is {} bytes, over {MAX_AMQP_NAME}",
                name.len()
            )));
        }
    }
    if amqp.exchange.is_empty() && amqp.routing_key.is_empty() {
        return Err(Status::invalid_argument(
            "amqp sink needs an exchange or a routing key (the default exchange routes by queue name)",
        ));
    }
    Ok(SinkTarget::Amqp {
        uri: amqp.uri,
        exchange: amqp.exchange,
        routing_key: amqp.routing_key,
    })
}

/// `address` if it is an `http://` URI with a host and a port.
fn http_uri(what: &str, address: &str, shape: &str) -> Result<String, Status> {
    let refuse =
        |why: &str| Status::invalid_argument(format!("{what} {address:?} {why}: give {shape}"));
    let uri: tonic::transport::Uri = address.parse().map_err(|_| refuse("is not a URI"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(refuse("uses https, which sinks do not support yet")),
        _ => return Err(refuse("has no http:// scheme")),
    }
    if uri.port_u16().is_none() || uri.host().is_none_or(str::is_empty) {
        return Err(refuse("has no host and port"));
    }
    Ok(address.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(address: &str) -> v1::SinkSpec {
        v1::SinkSpec {
            target: Some(v1::sink_spec::Target::Grpc(v1::GrpcSink {
                address: address.into(),
            })),
            ..Default::default()
        }
    }

    #[test]
    fn zero_fields_take_the_defaults() {
        let sink = from_wire(Some(grpc("http://127.0.0.1:9000"))).unwrap();
        assert_eq!(sink.batch_max, DEFAULT_BATCH_MAX);
        assert_eq!(sink.batch_max_bytes, DEFAULT_BATCH_MAX_BYTES);
        assert_eq!(sink.linger_ms, DEFAULT_LINGER_MS);
        assert_eq!(sink.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert_eq!(from_wire(Some(to_wire(sink.clone()))).unwrap(), sink);
    }

    #[test]
    fn sink_nobody_could_dial_is_refused_naming_why() {
        for (address, why) in [
            ("127.0.0.1:9000", "scheme"),
            ("https://sink:443", "https"),
            ("http://sink", "host and port"),
            ("not a uri", "not a URI"),
        ] {
            let refused = from_wire(Some(grpc(address))).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument);
            assert!(
                refused.message().contains(why),
                "{address}: {}",
                refused.message()
            );
        }
        let webhook = v1::SinkSpec {
            target: Some(v1::sink_spec::Target::Webhook(v1::WebhookSink {
                url: "sink:80/in".into(),
            })),
            ..Default::default()
        };
        assert!(
            from_wire(Some(webhook))
                .unwrap_err()
                .message()
                .contains("webhook url")
        );
        let no_target = from_wire(Some(v1::SinkSpec::default())).unwrap_err();
        assert!(no_target.message().contains("no target"));
    }

    #[test]
    fn out_of_range_batching_is_refused() {
        let mut wire = grpc("http://sink:1");
        wire.batch_max = MAX_BATCH_MAX + 1;
        assert!(
            from_wire(Some(wire))
                .unwrap_err()
                .message()
                .contains("batch_max")
        );
        let mut wire = grpc("http://sink:1");
        wire.max_in_flight = MAX_IN_FLIGHT + 1;
        assert!(
            from_wire(Some(wire))
                .unwrap_err()
                .message()
                .contains("max_in_flight")
        );
        let mut wire = grpc("http://sink:1");
        wire.timeout_ms = 10;
        assert!(
            from_wire(Some(wire))
                .unwrap_err()
                .message()
                .contains("timeout_ms")
        );
    }
}
