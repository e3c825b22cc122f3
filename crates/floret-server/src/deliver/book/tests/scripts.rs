//! Replays the dispatch-book scripts in `deliver/book/scripts/*.txt` and
//! compares each command's output with the `> ` lines recorded under it.
//! Run with `FLORET_UPDATE_SCRIPTS=1` to rewrite the recorded output after a
//! deliberate change, then review the diff.
//!
//! The book runs over four shards (0 to 3), none led at the start; a
//! producer stays on the shard it first produced on. Deliveries are written
//! `queue/producer/sequence#attempt`. After every command the runner prints
//! what consumers received (`c1 <- q/a/0#1`) and the discards the book
//! decided (`discard q/a/0#1 expired dead-letter`).
//!
//! Commands (durations take `ms` or `s`):
//! - `lead 0`, `lose 0`: this node gains or loses shard 0's leadership
//! - `produce q a 3`, `produce q a 3 shard=1 delay=5s`: three messages of `a` applied
//! - `subscribe q 2`: a consumer of `q` with 2 credits (prints its id)
//! - `credit 1 3`, `set-credits 1 0`: grant consumer 1 three more, or set its credits
//! - `ack q/a/0#1`, `dead-letter q/a/0#1`: settle and commit the removal
//! - `ack-uncommitted q/a/0#1`: settle only; the removal has not committed yet
//! - `nack q/a/0#1`
//! - `close 1`: consumer 1's stream closes unnoticed; `gone 1`: the node notices
//! - `advance 30s`: move the clock, then expire leases and release held messages
//! - `policy q * ttl=1s`, `policy q a weight=3 max_in_flight=1 max_attempts=2
//!   priority=1 expiry=drop`: set a queue's defaults (on every shard) or an override
//! - `commit-discards`: the decided discards commit; `fail-discards`: their proposals fail
//! - `status q`: the queue's counters; `stored q a 0`: whether the store holds it
//! - `watch-backlog`: from here on, also print the backlog reports
//!   consumers receive (`c1 backlog 3`)

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floret_store::ShardId;
use floret_store::policy::{Expiry, Policy};

use super::Harness;
use crate::deliver::{ConsumerEvent, SettleCode, SettleKind, SettleOutcome};
use crate::delivery_id::DeliveryId;

/// Set to 1 to rewrite the recorded output instead of comparing.
const UPDATE_ENV: &str = "FLORET_UPDATE_SCRIPTS";

/// Prefix of a recorded output line.
const OUTPUT: &str = "> ";

/// Shards of the scripts' book.
const SHARDS: usize = 4;

#[test]
fn dispatch_book_scripts_replay_as_recorded() {
    let update = std::env::var(UPDATE_ENV).is_ok_and(|value| value == "1");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/deliver/book/scripts");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("the scripts folder exists")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no scripts in {}", dir.display());
    let mut failures = Vec::new();
    for path in paths {
        let recorded = fs::read_to_string(&path).expect("script is readable");
        match replay(&recorded) {
            Err(error) => failures.push(format!("{}: {error}", path.display())),
            Ok(replayed) if replayed == recorded => {}
            Ok(replayed) if update => fs::write(&path, replayed).expect("script is writable"),
            Ok(replayed) => failures.push(format!(
                "{}: {}",
                path.display(),
                first_difference(&recorded, &replayed)
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "scripts differ from their recorded output; rerun with {UPDATE_ENV}=1 to accept:\n{}",
        failures.join("\n"),
    );
}

/// Runs a script and returns it with freshly generated output lines.
fn replay(script: &str) -> Result<String, String> {
    let mut runner = Runner::default();
    let mut replayed = String::new();
    for (number, line) in (1..).zip(script.lines()) {
        if line.starts_with(OUTPUT.trim_end()) {
            continue;
        }
        replayed.push_str(line);
        replayed.push('\n');
        let command = line.trim();
        if command.is_empty() || command.starts_with('#') {
            continue;
        }
        let output = runner
            .run(command)
            .map_err(|error| format!("line {number}: `{command}`: {error}"))?;
        for output_line in output {
            replayed.push_str(OUTPUT);
            replayed.push_str(&output_line);
            replayed.push('\n');
        }
    }
    Ok(replayed)
}

/// The first line where the replay differs, with both versions.
fn first_difference(recorded: &str, replayed: &str) -> String {
    let mut old = recorded.lines();
    let mut new = replayed.lines();
    for number in 1.. {
        match (old.next(), new.next()) {
            (None, None) => break,
            (was, now) if was != now => {
                return format!(
                    "line {number}: recorded {:?}, replayed {:?}",
                    was.unwrap_or("<end>"),
                    now.unwrap_or("<end>")
                );
            }
            _ => {}
        }
    }
    "no difference".to_owned()
}

struct Runner {
    harness: Harness,
    /// The shard each producer produced on first.
    placement: HashMap<String, ShardId>,
    /// Whether backlog reports are printed.
    watch_backlog: bool,
}

impl Default for Runner {
    fn default() -> Self {
        Self {
            harness: Harness::new(SHARDS),
            placement: HashMap::new(),
            watch_backlog: false,
        }
    }
}

impl Runner {
    fn run(&mut self, command: &str) -> Result<Vec<String>, String> {
        let words: Vec<&str> = command.split_whitespace().collect();
        // Committing or failing takes every pending discard first: what is
        // left after is new.
        let discards_before = match words.as_slice() {
            ["commit-discards" | "fail-discards"] => 0,
            _ => self.harness.pending_discards.len(),
        };
        let mut output = self.command(&words)?;
        for (consumer, event) in self.harness.take_events() {
            match event {
                ConsumerEvent::Delivery(delivered) => {
                    output.push(format!("c{consumer} <- {}", short(&delivered.ticket.id)));
                }
                ConsumerEvent::Backlog(report) if self.watch_backlog => {
                    let mut line = format!("c{consumer} backlog {}", report.weight);
                    for tenant in &report.tenants {
                        line += &format!(" {}={}", tenant.tenant, tenant.producer_weight);
                    }
                    output.push(line);
                }
                _ => {}
            }
        }
        for discard in &self.harness.pending_discards[discards_before..] {
            for (id, message) in discard.ids.iter().zip(&discard.messages) {
                let reason = format!("{:?}", message.reason).to_lowercase();
                let fate = if message.dead_letter {
                    "dead-letter"
                } else {
                    "drop"
                };
                output.push(format!("discard {} {reason} {fate}", short(id)));
            }
        }
        Ok(output)
    }

    fn command(&mut self, words: &[&str]) -> Result<Vec<String>, String> {
        let harness = &mut self.harness;
        match words {
            ["lead", shard] => harness.leadership(parse(shard)?, true),
            ["lose", shard] => harness.leadership(parse(shard)?, false),
            ["produce", queue, producer, count, options @ ..] => {
                let mut shard = self.placement.get(*producer).copied().unwrap_or(0);
                let mut delay = None;
                for option in options {
                    match option.split_once('=') {
                        Some(("shard", value)) => shard = parse(value)?,
                        Some(("delay", value)) => delay = Some(parse_duration(value)?),
                        _ => return Err(format!("unknown option `{option}`")),
                    }
                }
                self.placement.insert(producer.to_string(), shard);
                let delay_ms = delay.map(|delay| delay.as_millis() as u64);
                harness.produce(shard, queue, producer, parse(count)?, delay_ms);
            }
            ["subscribe", queue, credits] => {
                let id = harness.subscribe(queue, parse(credits)?);
                return Ok(vec![format!("consumer {id}")]);
            }
            ["credit", consumer, credits] => {
                harness.credit(parse(consumer)?, parse(credits)?, false)
            }
            ["set-credits", consumer, credits] => {
                harness.credit(parse(consumer)?, parse(credits)?, true)
            }
            [
                verb @ ("ack" | "ack-uncommitted" | "nack" | "dead-letter"),
                id,
            ] => {
                let kind = match *verb {
                    "nack" => SettleKind::Nack,
                    "dead-letter" => SettleKind::DeadLetter,
                    _ => SettleKind::Ack,
                };
                let id = self.delivery_id(id)?;
                let outcome = self.harness.settle(kind, &id, *verb != "ack-uncommitted");
                return Ok(vec![describe(&outcome)]);
            }
            ["close", consumer] => harness.close(parse(consumer)?),
            ["gone", consumer] => harness.gone(parse(consumer)?),
            ["advance", by] => harness.advance(parse_duration(by)?),
            ["policy", queue, producer, settings @ ..] => {
                return self.policy(queue, producer, settings);
            }
            ["commit-discards"] => {
                return Ok(vec![format!("committed {}", harness.commit_discards())]);
            }
            ["fail-discards"] => harness.pending_discards.clear(),
            ["watch-backlog"] => self.watch_backlog = true,
            ["status", queue] => return Ok(vec![self.status(queue)]),
            ["stored", queue, producer, sequence] => {
                let shard = self.placement.get(*producer).copied().unwrap_or(0);
                let stored = self
                    .harness
                    .stored(shard, queue, producer, parse(sequence)?);
                return Ok(vec![if stored { "yes" } else { "no" }.to_owned()]);
            }
            _ => return Err("unknown command".to_owned()),
        }
        Ok(Vec::new())
    }

    fn policy(
        &mut self,
        queue: &str,
        producer: &str,
        settings: &[&str],
    ) -> Result<Vec<String>, String> {
        let mut policy = Policy::default();
        for setting in settings {
            let (name, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("`{setting}` is not name=value"))?;
            match name {
                "weight" => policy.weight = Some(parse(value)?),
                "priority" => policy.priority = Some(parse(value)?),
                "max_in_flight" => policy.max_in_flight = Some(parse(value)?),
                "max_attempts" => policy.max_attempts = Some(parse(value)?),
                "ttl" => policy.ttl_ms = Some(parse_duration(value)?.as_millis() as u64),
                "expiry" if value == "drop" => policy.expiry = Some(Expiry::Drop),
                "expiry" if value == "dead-letter" => policy.expiry = Some(Expiry::DeadLetter),
                _ => return Err(format!("unknown setting `{setting}`")),
            }
        }
        if producer == "*" {
            for shard in 0..SHARDS as ShardId {
                self.harness.set_policy(shard, queue, None, policy);
            }
        } else {
            let shard = self.placement.get(producer).copied().unwrap_or(0);
            self.harness
                .set_policy(shard, queue, Some(producer), policy);
        }
        Ok(Vec::new())
    }

    fn status(&mut self, queue: &str) -> String {
        let now = self.harness.now();
        let activity = self.harness.book.activity(false, now);
        let Some(queue) = activity.get(queue) else {
            return "no such queue".to_owned();
        };
        format!(
            "ready={} in_flight={} backlogged={} delivered={} acked={} redelivered={} consumers={}",
            queue.ready,
            queue.in_flight,
            queue.backlogged_producers,
            queue.delivered,
            queue.acked,
            queue.redelivered,
            queue.consumers
        )
    }

    /// `q/a/0#1` with the shard `a` produced on.
    fn delivery_id(&self, text: &str) -> Result<DeliveryId, String> {
        let malformed = || format!("`{text}` is not queue/producer/sequence#attempt");
        let (rest, attempt) = text.split_once('#').ok_or_else(malformed)?;
        let mut parts = rest.split('/');
        let (Some(queue), Some(producer), Some(sequence), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        Ok(DeliveryId {
            shard: self.placement.get(producer).copied().unwrap_or(0),
            queue: queue.to_owned(),
            producer: producer.to_owned(),
            sequence: parse(sequence)?,
            attempt: parse(attempt)?,
        })
    }
}

fn short(id: &DeliveryId) -> String {
    format!(
        "{}/{}/{}#{}",
        id.queue, id.producer, id.sequence, id.attempt
    )
}

fn describe(outcome: &SettleOutcome) -> String {
    let code = format!("{:?}", outcome.code).to_lowercase();
    match (outcome.code, outcome.message.as_str()) {
        (SettleCode::Ok, "") => "ok".to_owned(),
        (_, message) => format!("{code}: {message}"),
    }
}

fn parse<T: std::str::FromStr>(word: &str) -> Result<T, String> {
    word.parse().map_err(|_| format!("cannot parse `{word}`"))
}

/// `30s` or `500ms`
fn parse_duration(word: &str) -> Result<Duration, String> {
    if let Some(millis) = word.strip_suffix("ms") {
        Ok(Duration::from_millis(parse(millis)?))
    } else if let Some(seconds) = word.strip_suffix('s') {
        Ok(Duration::from_secs(parse(seconds)?))
    } else {
        Err(format!("`{word}` needs a unit, s or ms"))
    }
}
