//! A produce load generator: `count` messages of `size` bytes over
//! `producers` producers, `batch` per request, `concurrency` requests in
//! flight; reports throughput and request latency percentiles. A worker
//! stops at its first failed request, so a dead node ends the run quickly.
//!
//! With `idempotent`, every producer is owned by one worker and sends
//! through the client's [`floret_client::Producer`], which retries with the
//! same idempotency sequence: the run rides out a leader failover, and the
//! longest request latency shows how long the failover stalled a producer.
//!
//! `floret bench throughput` and `scale` drive it too: with a `deadline` no
//! batch starts after it, and `counters` shows the messages acknowledged so
//! far on the progress line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floret_client::{Client, Message};

use super::{Counters, Percentiles};

/// What to generate.
pub struct LoadSpec {
    pub queue: String,
    pub producer_prefix: String,
    pub count: u64,
    pub size: usize,
    pub producers: usize,
    pub batch: usize,
    pub concurrency: usize,
    pub idempotent: bool,
    /// No batch starts after this.
    pub deadline: Option<Instant>,
    /// Acknowledged messages are counted here as they are acknowledged.
    pub counters: Arc<Counters>,
}

/// What a load run measured.
pub struct LoadReport {
    pub messages: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Produce request latencies.
    pub latency: Percentiles,
    pub failures: u64,
    /// Why the first failed request failed.
    pub first_failure: Option<String>,
    /// Every acknowledged request, in no particular order, for plots over time.
    pub calls: Vec<AcknowledgedCall>,
}

/// One acknowledged produce request.
#[derive(Debug, Clone, Copy)]
pub struct AcknowledgedCall {
    /// When its answer arrived.
    pub answered: Instant,
    pub latency: Duration,
    pub messages: u64,
}

pub async fn produce(client: &Client, spec: &LoadSpec) -> anyhow::Result<LoadReport> {
    let batches = spec.count.div_ceil(spec.batch as u64);
    let next_batch = Arc::new(AtomicU64::new(0));
    let payload = vec![b'x'; spec.size];
    let started = Instant::now();
    let mut workers = Vec::with_capacity(spec.concurrency);
    let concurrency = if spec.idempotent {
        spec.concurrency.min(spec.producers)
    } else {
        spec.concurrency
    };
    for worker in 0..concurrency {
        let client = client.clone();
        let mut own_producers: Vec<_> = (worker..spec.producers)
            .step_by(concurrency)
            .map(|p| client.producer(&spec.queue, &format!("{}-{p}", spec.producer_prefix)))
            .collect();
        let idempotent = spec.idempotent;
        let next_batch = next_batch.clone();
        let payload = payload.clone();
        let queue = spec.queue.clone();
        let prefix = spec.producer_prefix.clone();
        let (count, batch, producers) = (spec.count, spec.batch as u64, spec.producers as u64);
        let (deadline, counters) = (spec.deadline, spec.counters.clone());
        workers.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut sent = 0u64;
            let mut failures = 0u64;
            let mut failure = None;
            let mut turn = 0usize;
            loop {
                let index = next_batch.fetch_add(1, Ordering::Relaxed);
                if index >= batches || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let in_batch = batch.min(count - index * batch);
                let producer = format!("{prefix}-{}", index % producers);
                let messages = (0..in_batch)
                    .map(|_| Message {
                        payload: payload.clone(),
                        headers: Default::default(),
                    })
                    .collect();
                let sent_at = Instant::now();
                let result = if idempotent {
                    turn += 1;
                    let own = own_producers.len();
                    own_producers[turn % own].send(messages).await
                } else {
                    client.produce(&queue, &producer, messages).await
                };
                match result {
                    Ok(_) => {
                        let answered = Instant::now();
                        calls.push(AcknowledgedCall {
                            answered,
                            latency: answered - sent_at,
                            messages: in_batch,
                        });
                        sent += in_batch;
                        counters.produced.fetch_add(in_batch, Ordering::Relaxed);
                    }
                    Err(error) => {
                        failures += 1;
                        counters.produce_failed(&error);
                        tracing::warn!(%error, "produce failed; this worker stops");
                        failure = Some(error.to_string());
                        break;
                    }
                }
            }
            (calls, sent, failures, failure)
        }));
    }
    let (mut messages, mut failures, mut calls) = (0, 0, Vec::new());
    let mut first_failure = None;
    for worker in workers {
        let (worker_calls, sent, worker_failures, failure) = worker.await?;
        calls.extend(worker_calls);
        messages += sent;
        failures += worker_failures;
        first_failure = first_failure.or(failure);
    }
    Ok(LoadReport {
        messages,
        bytes: messages * spec.size as u64,
        elapsed: started.elapsed(),
        latency: Percentiles::of(calls.iter().map(|call| call.latency).collect()),
        failures,
        first_failure,
        calls,
    })
}

impl LoadReport {
    /// Acknowledged messages per second.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    pub fn print(&self, json: bool) {
        let seconds = self.elapsed.as_secs_f64().max(f64::EPSILON);
        let rate = self.rate();
        let mb_per_second = self.bytes as f64 / seconds / 1e6;
        let latency = &self.latency;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "messages": self.messages,
                    "failed_requests": self.failures,
                    "first_failure": self.first_failure,
                    "seconds": seconds,
                    "messages_per_second": rate,
                    "megabytes_per_second": mb_per_second,
                    "latency_ms": {"p50": latency.p50_ms, "p99": latency.p99_ms, "p999": latency.p999_ms, "max": latency.max_ms},
                })
            );
        } else {
            println!(
                "produced {} messages in {seconds:.2} s: {rate:.0} msg/s, {mb_per_second:.2} MB/s; request latency p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms; {} failed requests",
                self.messages,
                latency.p50_ms,
                latency.p99_ms,
                latency.p999_ms,
                latency.max_ms,
                self.failures
            );
            if let Some(failure) = &self.first_failure {
                println!("first failed request: {failure}");
            }
        }
    }
}
