//! Replays the scheduler scripts in `tests/scripts/*.txt` and compares each
//! command's output with the `> ` lines recorded under it.
//!
//! A script is a list of commands, one per line; `#` lines are comments. Each
//! command's output follows it as `> ` lines. Run with
//! `FLORET_UPDATE_SCRIPTS=1` to rewrite the recorded output after a deliberate
//! change, then review the diff.
//!
//! Commands (producer names are words, times are offsets from the start):
//!
//! - `enqueue a 1..4`: sequences 1, 2 and 3 of `a` were committed
//! - `weight a 3`, `weight a default`: set or clear a weight override
//! - `next`, `next 5`: dispatch once or up to five times
//! - `ack a 1 1`, `nack a 1 1`: settle (producer, sequence, attempt)
//! - `expire +31s`: move the clock forward, then expire leases
//! - `forget a`: drop a producer
//! - `producer a`: one producer's view
//! - `status`: the scheduler's totals and next deadline

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floret_sched::{ProducerPolicy, Scheduler, SchedulerConfig};

/// Set to 1 to rewrite the recorded output instead of comparing.
const UPDATE_ENV: &str = "FLORET_UPDATE_SCRIPTS";

/// Prefix of a recorded output line.
const OUTPUT: &str = "> ";

/// Lines of unchanged text shown around each difference.
const DIFF_CONTEXT: usize = 2;

#[test]
fn scheduler_scripts_replay_as_recorded() {
    let update = std::env::var(UPDATE_ENV).is_ok_and(|value| value == "1");
    let scripts = script_paths();
    assert!(!scripts.is_empty(), "no scripts in tests/scripts");
    let mut failures = Vec::new();
    for path in scripts {
        let recorded = fs::read_to_string(&path).expect("script is readable");
        let replayed = match replay(&recorded) {
            Ok(replayed) => replayed,
            Err(error) => {
                failures.push(format!("{}: {error}", path.display()));
                continue;
            }
        };
        if replayed == recorded {
            continue;
        }
        if update {
            fs::write(&path, replayed).expect("script is writable");
        } else {
            failures.push(format!(
                "{}:\n{}",
                path.display(),
                diff(&recorded, &replayed)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "scripts differ from their recorded output (- recorded, + replayed); \
         rerun with {UPDATE_ENV}=1 to accept:\n\n{}",
        failures.join("\n"),
    );
}

fn script_paths() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)
        .expect("tests/scripts exists")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    paths.sort();
    paths
}

/// Runs a script and returns it with freshly generated output lines.
fn replay(script: &str) -> Result<String, String> {
    let mut runner = Runner::new();
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

/// A scheduler with default config and a clock the script moves.
struct Runner {
    scheduler: Scheduler<Arc<str>>,
    start: Instant,
    now: Instant,
}

impl Runner {
    fn new() -> Self {
        let start = Instant::now();
        Self {
            scheduler: Scheduler::new(SchedulerConfig::default()),
            start,
            now: start,
        }
    }

    fn run(&mut self, command: &str) -> Result<Vec<String>, String> {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["enqueue", producer, range] => {
                self.scheduler.enqueued(&key(producer), parse_range(range)?);
                Ok(Vec::new())
            }
            ["weight", producer, "default"] => {
                self.scheduler.set_policy(&key(producer), None);
                Ok(Vec::new())
            }
            ["weight", producer, weight] => {
                self.scheduler
                    .set_policy(&key(producer), Some(weighted(parse(weight)?)));
                Ok(Vec::new())
            }
            ["next"] => Ok(self.next(1)),
            ["next", count] => Ok(self.next(parse(count)?)),
            ["ack", producer, sequence, attempt] => {
                let result = self
                    .scheduler
                    .ack(&key(producer), parse(sequence)?, parse(attempt)?);
                Ok(vec![settled(result)])
            }
            ["nack", producer, sequence, attempt] => {
                let result = self
                    .scheduler
                    .nack(&key(producer), parse(sequence)?, parse(attempt)?);
                Ok(vec![settled(result)])
            }
            ["expire", offset] => {
                self.now += parse_offset(offset)?;
                Ok(vec![format!("expired {}", self.scheduler.expire(self.now))])
            }
            ["forget", producer] => {
                self.scheduler.forget(&key(producer));
                Ok(Vec::new())
            }
            ["producer", producer] => Ok(vec![match self.scheduler.producer(&key(producer)) {
                Some(view) => format!(
                    "ready={} in_flight={} weight={} deficit={}",
                    view.ready, view.in_flight, view.weight, view.deficit
                ),
                None => "none".to_owned(),
            }]),
            ["status"] => Ok(vec![self.status()]),
            _ => Err("unknown command".to_owned()),
        }
    }

    fn next(&mut self, count: usize) -> Vec<String> {
        let mut output = Vec::new();
        for _ in 0..count {
            match self.scheduler.next(self.now) {
                Some(dispatch) => output.push(format!(
                    "{} {} attempt={}",
                    dispatch.producer, dispatch.sequence, dispatch.attempt
                )),
                None => {
                    output.push("none".to_owned());
                    break;
                }
            }
        }
        output
    }

    fn status(&self) -> String {
        let deadline = match self.scheduler.next_deadline() {
            Some(deadline) => format!("+{:?}", deadline - self.start),
            None => "none".to_owned(),
        };
        format!(
            "ready={} in_flight={} backlogged={} backlogged_weight={} next_deadline={deadline}",
            self.scheduler.ready_messages(),
            self.scheduler.in_flight(),
            self.scheduler.backlogged_producers(),
            self.scheduler.backlogged_weight(),
        )
    }
}

fn key(producer: &str) -> Arc<str> {
    Arc::from(producer)
}

fn settled(result: Result<(), floret_sched::SettleError>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(error) => format!("error: {error}"),
    }
}

fn parse<T: std::str::FromStr>(word: &str) -> Result<T, String> {
    word.parse().map_err(|_| format!("cannot parse `{word}`"))
}

/// `1..4`
fn parse_range(word: &str) -> Result<std::ops::Range<u64>, String> {
    let (start, end) = word
        .split_once("..")
        .ok_or_else(|| format!("`{word}` is not a range like 1..4"))?;
    Ok(parse(start)?..parse(end)?)
}

/// `+31s` or `+500ms`
fn parse_offset(word: &str) -> Result<Duration, String> {
    let amount = word
        .strip_prefix('+')
        .ok_or_else(|| format!("`{word}` is not an offset like +31s"))?;
    if let Some(millis) = amount.strip_suffix("ms") {
        Ok(Duration::from_millis(parse(millis)?))
    } else if let Some(seconds) = amount.strip_suffix('s') {
        Ok(Duration::from_secs(parse(seconds)?))
    } else {
        Err(format!("`{word}` needs a unit, s or ms"))
    }
}

/// Line diff (longest common subsequence) showing only the changed lines and
/// a little context, each tagged with its line number in the recorded text.
fn diff(recorded: &str, replayed: &str) -> String {
    let old: Vec<&str> = recorded.lines().collect();
    let new: Vec<&str> = replayed.lines().collect();
    let mut common = vec![vec![0usize; new.len() + 1]; old.len() + 1];
    for i in (0..old.len()).rev() {
        for j in (0..new.len()).rev() {
            common[i][j] = if old[i] == new[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let mut lines = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        if i < old.len() && j < new.len() && old[i] == new[j] {
            lines.push((' ', i + 1, old[i]));
            (i, j) = (i + 1, j + 1);
        } else if j < new.len() && (i == old.len() || common[i][j + 1] >= common[i + 1][j]) {
            lines.push(('+', i + 1, new[j]));
            j += 1;
        } else {
            lines.push(('-', i + 1, old[i]));
            i += 1;
        }
    }
    let changed: Vec<usize> = (0..lines.len()).filter(|&k| lines[k].0 != ' ').collect();
    let near_change = |k: usize| changed.iter().any(|&c| c.abs_diff(k) <= DIFF_CONTEXT);
    let mut shown = String::new();
    let mut skipped = false;
    for (k, (tag, number, text)) in lines.iter().enumerate() {
        if near_change(k) {
            shown.push_str(&format!("{number:>4} {tag} {text}\n"));
            skipped = false;
        } else if !skipped {
            shown.push_str("     ...\n");
            skipped = true;
        }
    }
    shown
}

/// An override giving `weight` and the defaults' other settings.
fn weighted(weight: u32) -> ProducerPolicy {
    ProducerPolicy {
        weight,
        ..ProducerPolicy::default()
    }
}
