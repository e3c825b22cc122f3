//! Scenario scripts for the entry lanes. A script is commands, each
//! followed by the lines it must print (`> ...`):
//!
//! - `push PRODUCER NAME BYTES` queues an operation in the producer's line
//!   (prints nothing, or `refused NAME: C calls, B bytes waiting`, with
//!   `(all lines hold S)` when the shard's bound refused it); a NAME
//!   starting with `+` folds into the line's last operation when it may;
//! - `settle NAME BYTES` queues a settling operation;
//! - `gone NAME` marks an operation's caller as gone: it is not proposed,
//!   and frees its place when its line is full;
//! - `entry` composes the next entry and prints its operations;
//! - `leaves? N` prints whether the next entry leaves now (`leaves`) or
//!   waits for a commit (`waits`) with N other entries in flight.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use super::{EntryLanes, Lane, LaneLimits};

/// A waiting operation of a script: its name, and whether its caller is gone.
#[derive(Debug)]
struct ScriptOp {
    name: String,
    gone: Rc<Cell<bool>>,
}

const LIMITS: LaneLimits = LaneLimits {
    entry_ops: 4,
    entry_bytes: 100,
    producer_calls: 3,
    producer_bytes: 150,
    shard_bytes: 10_000,
};

fn run(script: &str) {
    run_under(LIMITS, script);
}

fn run_under(limits: LaneLimits, script: &str) {
    let mut lanes = EntryLanes::new(limits, |op: &ScriptOp| op.gone.get());
    let mut callers: HashMap<String, Rc<Cell<bool>>> = HashMap::new();
    let mut op = |name: &str| {
        let gone = callers.entry(name.to_owned()).or_default().clone();
        ScriptOp {
            name: name.to_owned(),
            gone,
        }
    };
    let mut printed = Vec::new();
    let mut expected = Vec::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(output) = line.strip_prefix('>') {
            expected.push(output.trim().to_owned());
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let size = |word: &str| word.parse::<usize>().expect("a size");
        match words.as_slice() {
            ["push", producer, name, bytes] => {
                let lane = Lane::Producer {
                    queue: "q".into(),
                    producer: (*producer).to_owned(),
                };
                let fold = |last: &mut ScriptOp, next: ScriptOp| {
                    if next.name.starts_with('+') {
                        last.name.push_str(&next.name);
                        None
                    } else {
                        Some(next)
                    }
                };
                if let Err((_, full)) = lanes.push(lane, op(name), size(bytes), fold) {
                    let shard = full
                        .shard_bytes
                        .map(|waiting| format!(" (all lines hold {waiting})"))
                        .unwrap_or_default();
                    printed.push(format!(
                        "refused {name}: {} calls, {} bytes waiting{shard}",
                        full.calls, full.bytes
                    ));
                }
            }
            ["settle", name, bytes] => {
                lanes
                    .push(Lane::Settle, op(name), size(bytes), |_, next| Some(next))
                    .expect("settles are never refused");
            }
            ["gone", name] => op(name).gone.set(true),
            ["entry"] => {
                let names: Vec<String> = lanes.next_entry().into_iter().map(|o| o.name).collect();
                printed.push(format!("entry: {}", names.join(" ")).trim().to_owned());
            }
            ["leaves?", in_flight] => {
                let leaves = lanes.leaves_now(size(in_flight));
                printed.push(if leaves { "leaves" } else { "waits" }.to_owned());
            }
            other => panic!("unknown command {other:?}"),
        }
    }
    assert_eq!(printed, expected, "script:\n{script}");
}

#[test]
fn a_quiet_producers_call_goes_into_the_next_entry_behind_a_flood() {
    run("
        push flood f1 10
        push flood f2 10
        push flood f3 10
        push quiet q1 10
        entry
        > entry: f1 q1 f2 f3
    ");
}

#[test]
fn producers_take_turns_across_entries_where_the_last_entry_stopped() {
    run("
        push a a1 1
        push a a2 1
        push a a3 1
        push b b1 1
        push b b2 1
        push b b3 1
        push c c1 1
        push c c2 1
        entry
        > entry: a1 b1 c1 a2
        entry
        > entry: b2 c2 a3 b3
        entry
        > entry:
    ");
}

#[test]
fn settles_go_first_so_acks_are_not_stuck_behind_produces() {
    run("
        push flood f1 10
        push flood f2 10
        settle ack1 5
        settle ack2 5
        entry
        > entry: ack1 ack2 f1 f2
    ");
}

#[test]
fn a_flooding_producer_is_refused_past_its_calls_and_others_are_not() {
    run("
        push flood f1 1
        push flood f2 1
        push flood f3 1
        push flood f4 1
        > refused f4: 3 calls, 3 bytes waiting
        push quiet q1 1
        entry
        > entry: f1 q1 f2 f3
        push flood f5 1
        entry
        > entry: f5
    ");
}

#[test]
fn a_producer_is_refused_past_its_bytes_but_one_large_call_still_goes_alone() {
    run("
        push big b1 80
        push big b2 80
        > refused b2: 1 calls, 80 bytes waiting
        push huge h1 400
        push small s1 30
        entry
        > entry: b1 h1
        entry
        > entry: s1
    ");
}

#[test]
fn an_entry_closes_at_its_bytes_after_the_operation_that_crossed_them() {
    run("
        push a a1 40
        push b b1 40
        push c c1 40
        push d d1 1
        entry
        > entry: a1 b1 c1
        entry
        > entry: d1
    ");
}

#[test]
fn a_call_whose_caller_is_gone_is_not_proposed_and_frees_its_place() {
    run("
        push flood f1 1
        push flood f2 1
        push flood f3 1
        gone f2
        push flood f4 1
        push quiet q1 1
        gone q1
        entry
        > entry: f1 f3 f4
    ");
}

#[test]
fn folded_calls_take_one_place_in_the_entry_and_still_count_against_the_bound() {
    run("
        push flood f1 10
        push flood +f2 10
        push flood +f3 10
        push flood +f4 10
        > refused +f4: 3 calls, 30 bytes waiting
        push quiet q1 10
        entry
        > entry: f1+f2+f3 q1
        push flood f5 10
        push flood +f6 10
        entry
        > entry: f5+f6
    ");
}

#[test]
fn calls_fold_only_up_to_an_entrys_bytes() {
    run("
        push big b1 60
        push big +b2 30
        push big +b3 30
        entry
        > entry: b1+b2 +b3
    ");
}

#[test]
fn a_line_emptied_of_gone_calls_does_not_take_two_turns() {
    run("
        push a a1 1
        push a a2 1
        push a a3 1
        gone a1
        gone a2
        gone a3
        push a a4 1
        push a a5 1
        push b b1 1
        entry
        > entry: a4 b1 a5
        entry
        > entry:
    ");
}

#[test]
fn many_producers_queue_without_bound_until_memory_runs_out() {
    let limits = LaneLimits {
        shard_bytes: 200,
        ..LIMITS
    };
    run_under(
        limits,
        "
        push a a1 60
        push b b1 60
        push c c1 60
        push a a2 60
        > refused a2: 1 calls, 60 bytes waiting (all lines hold 180)
        push d d1 60
        push d d2 60
        > refused d2: 1 calls, 60 bytes waiting (all lines hold 240)
        entry
        > entry: a1 b1
        push a a2 60
        ",
    );
}

#[test]
fn a_lone_call_on_an_idle_shard_leaves_at_once() {
    run("
        leaves? 0
        > waits
        push a a1 1
        leaves? 0
        > leaves
    ");
}

#[test]
fn trickling_calls_behind_an_entry_in_flight_fill_the_next_one_before_it_leaves() {
    run("
        push a a1 1
        leaves? 1
        > waits
        push b b1 1
        push c c1 1
        leaves? 1
        > waits
        leaves? 0
        > leaves
        push d d1 1
        leaves? 1
        > leaves
        entry
        > entry: a1 b1 c1 d1
        leaves? 1
        > waits
    ");
}

#[test]
fn a_flood_that_fills_entries_by_bytes_keeps_them_pipelined() {
    run("
        push flood f1 60
        leaves? 1
        > waits
        push flood f2 50
        leaves? 1
        > leaves
        entry
        > entry: f1 f2
    ");
}

#[test]
fn folded_calls_fill_an_entry_by_bytes_not_by_operations() {
    run("
        push a a1 30
        push a +a2 30
        push a +a3 30
        leaves? 1
        > waits
        push b b1 10
        leaves? 1
        > leaves
        entry
        > entry: a1+a2+a3 b1
        leaves? 1
        > waits
    ");
}

#[test]
fn waiting_settles_count_towards_a_full_entry() {
    run("
        settle s1 1
        settle s2 1
        push a a1 1
        leaves? 1
        > waits
        settle s3 1
        leaves? 1
        > leaves
        entry
        > entry: s1 s2 s3 a1
    ");
}

#[test]
fn gone_calls_dropped_from_a_full_line_no_longer_count_towards_an_entry() {
    run("
        push flood f1 1
        push flood f2 1
        push flood f3 1
        push quiet q1 1
        leaves? 1
        > leaves
        gone f1
        gone f2
        gone f3
        push flood f4 1
        leaves? 1
        > waits
        entry
        > entry: f4 q1
    ");
}
