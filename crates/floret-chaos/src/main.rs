//! `floret-chaos`: the long soak. Runs the fault schedules one after
//! another, each on a fresh three-node cluster for `--rounds` faults, until
//! `--minutes` have passed, then prints a summary table per schedule. Exits
//! with status 1 when any run found a problem; its history and node logs
//! are kept.
//!
//! ```text
//! cargo build --release -p floret-cli --features failpoints
//! cargo run --release -p floret-chaos -- --floret target/release/floret --minutes 20
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use floret_chaos::checker::percentile;
use floret_chaos::workload::WorkloadSpec;
use floret_chaos::{RunResult, RunSpec, Schedule, run};

#[derive(Parser)]
#[command(about = "Soak floret under faults and check that nothing acknowledged is lost")]
struct Args {
    /// The floret binary, built with `--features failpoints`.
    #[arg(long, default_value = "target/release/floret")]
    floret: PathBuf,
    /// Keep starting runs until this many minutes have passed.
    #[arg(long, default_value_t = 20)]
    minutes: u64,
    /// Faults per run (each run is one schedule on a fresh cluster).
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Schedules to cycle through, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    schedules: Vec<String>,
    /// Producer tasks.
    #[arg(long, default_value_t = 12)]
    producers: u32,
    /// Seconds of load before the first fault and after each heal.
    #[arg(long, default_value_t = 2)]
    load_seconds: u64,
    /// Where runs keep their data dirs (a failed run's stays).
    #[arg(long, default_value = "chaos-runs")]
    root: PathBuf,
    /// Keep every run's data dirs, logs and history, not only failed ones'.
    #[arg(long)]
    keep: bool,
    /// Also write every run's result as JSON lines here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run every cluster over TLS on the client ports and mutual TLS
    /// between the nodes (certificates from `floret certs`).
    #[arg(long)]
    tls: bool,
    /// Cut every node's gossip (UDP) for whole runs: delivery and fairness
    /// must not depend on it.
    #[arg(long)]
    gossip_cut: bool,
    /// Give every node token keys and produce as this many tenants (the
    /// producers spread over them), consuming as one more: ack ownership,
    /// tenant namespaces and fairness between tenants under the faults
    /// (a count that divides --producers keeps every producer's share
    /// equal, which the fairness figure expects).
    #[arg(long)]
    tenants: Option<u32>,
}

/// Totals of one schedule over its runs.
#[derive(Default)]
struct Totals {
    runs: u32,
    rounds: u32,
    attempted: u64,
    acknowledged: u64,
    delivered: u64,
    lost: u64,
    duplicated: u64,
    recovered: u64,
    unknown: u64,
    leader_losses: usize,
    unavailability_ms: Vec<u64>,
    produce_ms: Vec<u64>,
    hand_back_ms: Vec<u64>,
    failed_runs: u32,
}

impl Totals {
    fn add(&mut self, result: &RunResult) {
        let report = &result.report;
        self.runs += 1;
        self.rounds += result.rounds;
        self.attempted += report.attempted;
        self.acknowledged += report.acknowledged;
        self.delivered += report.delivered;
        self.lost += report.lost.len() as u64;
        self.duplicated += report.duplicated;
        self.recovered += report.recovered;
        self.unknown += report.unknown;
        self.leader_losses += report.unavailability_ms.len();
        self.unavailability_ms
            .extend(report.unavailability_ms.iter().copied());
        self.produce_ms.extend(report.produce_ms.iter().copied());
        self.hand_back_ms
            .extend(report.hand_back_ms.iter().copied());
        if !result.problems().is_empty() {
            self.failed_runs += 1;
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let schedules: Vec<Schedule> = if args.schedules.is_empty() {
        Schedule::ALL.to_vec()
    } else {
        args.schedules
            .iter()
            .map(|name| {
                Schedule::from_name(name)
                    .ok_or_else(|| anyhow::anyhow!("no schedule called {name:?}"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(args.minutes * 60);
    let mut totals: BTreeMap<&'static str, Totals> = BTreeMap::new();
    let mut json = match &args.json {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    };
    let mut failed = false;
    let mut index = 0usize;
    while Instant::now() < deadline {
        let schedule = schedules[index % schedules.len()];
        let root = args.root.join(format!("{index:04}-{}", schedule.name()));
        index += 1;
        let _fresh = std::fs::remove_dir_all(&root);
        let spec = RunSpec {
            schedule,
            rounds: args.rounds,
            binary: args.floret.clone(),
            root: root.clone(),
            workload: WorkloadSpec {
                producers: args.producers,
                ..WorkloadSpec::default()
            },
            start_failpoints: String::new(),
            load_between_faults: Duration::from_secs(args.load_seconds),
            tls: args.tls,
            gossip_cut: args.gossip_cut,
            tenants: args.tenants,
        };
        let result = runtime.block_on(run(spec))?;
        let problems = result.problems();
        println!(
            "{:<22} {:>4.0} s  acked {:>6}  lost {}  dup {:>5}  unavailability {:?} ms  hand-back {:?} ms  fault-free Jain {}  {}",
            result.schedule,
            result.seconds,
            result.report.acknowledged,
            result.report.lost.len(),
            result.report.duplicated,
            result.report.unavailability_ms,
            result.report.hand_back_ms,
            result
                .report
                .fault_free_fairness
                .map_or("-".to_owned(), |(median, windows)| format!(
                    "{median:.3} over {windows} s"
                )),
            if problems.is_empty() {
                "ok".to_owned()
            } else {
                format!("FAILED (kept in {}): {problems:?}", root.display())
            }
        );
        if let Some(file) = json.as_mut() {
            use std::io::Write;
            writeln!(file, "{}", serde_json::to_string(&result)?)?;
        }
        if problems.is_empty() && !args.keep {
            let _cleaned = std::fs::remove_dir_all(&root);
        } else {
            failed = true;
        }
        totals.entry(result.schedule).or_default().add(&result);
    }
    print_summary(&totals);
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

fn print_summary(totals: &BTreeMap<&'static str, Totals>) {
    println!(
        "\n{:<22} {:>4} {:>6} {:>9} {:>9} {:>9} {:>5} {:>7} {:>7} {:>7} {:>7} {:>12} {:>16} {:>16} {:>6}",
        "schedule",
        "runs",
        "faults",
        "attempted",
        "acked",
        "delivered",
        "lost",
        "dup",
        "unknown",
        "recov",
        "leader",
        "unavail p50/max",
        "produce p99/max",
        "hand-back p50/max",
        "failed"
    );
    let mut all = Totals::default();
    for (name, t) in totals {
        print_row(name, t);
        all.runs += t.runs;
        all.rounds += t.rounds;
        all.attempted += t.attempted;
        all.acknowledged += t.acknowledged;
        all.delivered += t.delivered;
        all.lost += t.lost;
        all.duplicated += t.duplicated;
        all.recovered += t.recovered;
        all.unknown += t.unknown;
        all.leader_losses += t.leader_losses;
        all.unavailability_ms
            .extend(t.unavailability_ms.iter().copied());
        all.produce_ms.extend(t.produce_ms.iter().copied());
        all.hand_back_ms.extend(t.hand_back_ms.iter().copied());
        all.failed_runs += t.failed_runs;
    }
    print_row("all", &all);
}

fn print_row(name: &str, t: &Totals) {
    let shown = |values: &[u64], rank: f64| {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let at = |rank| percentile(&sorted, rank).map_or("-".to_owned(), |ms| ms.to_string());
        format!("{}/{}", at(rank), at(1.0))
    };
    println!(
        "{:<22} {:>4} {:>6} {:>9} {:>9} {:>9} {:>5} {:>7} {:>7} {:>7} {:>7} {:>12} {:>16} {:>16} {:>6}",
        name,
        t.runs,
        t.rounds,
        t.attempted,
        t.acknowledged,
        t.delivered,
        t.lost,
        t.duplicated,
        t.unknown,
        t.recovered,
        t.leader_losses,
        shown(&t.unavailability_ms, 0.5),
        shown(&t.produce_ms, 0.99),
        shown(&t.hand_back_ms, 0.5),
        t.failed_runs
    );
}
