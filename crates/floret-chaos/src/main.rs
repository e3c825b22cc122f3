//! Runs the chaos schedules against real `floret serve` processes.

fn main() {}
