//! A queue's sink into a real RabbitMQ (Debian's `rabbitmq-server`, which
//! `.ci/run` installs when missing), started by the tests on loopback
//! ports: messages arrive with their headers and nothing is lost
//! (`amqp_sink.rs`), and quiet producers are not stuck behind a flood as
//! they are when publishing straight into RabbitMQ
//! (`rabbitmq_noisy_neighbor.rs`). Its own test binary, so the timing of
//! the second does not share the cores with the other tests.

mod amqp_sink;
mod harness;
mod rabbitmq_noisy_neighbor;
