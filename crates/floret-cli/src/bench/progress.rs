//! The live line a benchmark shows while it runs: elapsed time, messages
//! produced and delivered, and their rates over the last second.
//!
//! On a terminal the line is redrawn in place on stderr; otherwise (a log
//! file, CI) a line is printed every [`PLAIN_EVERY`].

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::sink::Counters;

/// How often the line is redrawn on a terminal.
const REDRAW_EVERY: Duration = Duration::from_millis(500);
/// How often a plain line is printed when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// The running progress line; dropped or [`Progress::finish`]ed to stop it.
pub struct Progress {
    task: JoinHandle<()>,
}

impl Progress {
    /// Shows progress of `counters` for a run that started at `run_start`;
    /// `expected` is the number of messages the run will produce, if known.
    pub fn start(run_start: Instant, counters: Arc<Counters>, expected: Option<u64>) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let every = if terminal { REDRAW_EVERY } else { PLAIN_EVERY };
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.tick().await;
            let (mut last_produced, mut last_delivered, mut last_at) = (0, 0, Instant::now());
            loop {
                ticks.tick().await;
                let produced = counters.produced.load(Ordering::Relaxed);
                let delivered = counters.first_deliveries.load(Ordering::Relaxed);
                let seconds = last_at.elapsed().as_secs_f64().max(f64::EPSILON);
                let line = format!(
                    "[{:>6.1} s] produced {produced}{} ({:.0}/s), delivered {delivered} ({:.0}/s), failed produces {}{}",
                    run_start.elapsed().as_secs_f64(),
                    expected.map(|e| format!("/{e}")).unwrap_or_default(),
                    (produced - last_produced) as f64 / seconds,
                    (delivered - last_delivered) as f64 / seconds,
                    counters.produce_failures.load(Ordering::Relaxed),
                    counters
                        .first_produce_failure
                        .get()
                        .map(|failure| format!(" (first: {failure})"))
                        .unwrap_or_default(),
                );
                (last_produced, last_delivered, last_at) = (produced, delivered, Instant::now());
                let mut stderr = std::io::stderr().lock();
                if terminal {
                    let _ = write!(stderr, "\r{line}\x1b[K");
                } else {
                    let _ = writeln!(stderr, "{line}");
                }
                let _ = stderr.flush();
            }
        });
        Self { task }
    }

    /// Stops the line and moves the cursor past it.
    pub fn finish(self) {
        self.task.abort();
        if std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
}
