//! Loopback ports for nodes that a test starts as separate processes.
//!
//! A port picked by binding port 0 comes from the kernel's ephemeral range,
//! the same range outgoing connections take their local ports from: between
//! picking it and the node binding it, a connection of an earlier node can
//! take it, and the node fails with "address already in use". Ports below
//! that range are never handed out to connections, so they are picked there,
//! checked free for TCP and for UDP (a node's gossip binds the same number),
//! and never handed out twice by one process.
//!
//! IMPLEMENTATION CAVEATS
//! - Another process may still bind a port between the pick and the node's
//!   bind; test runs on one machine take turns, so that is not expected.

use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out.
const LOWEST: u16 = 10_000;
/// The start of the ephemeral range when the kernel does not say.
const EPHEMERAL_START: u16 = 32_768;

/// How far into the candidate ports the next pick starts; spread by process
/// so that runs one after another do not reuse ports in TIME_WAIT.
static NEXT_CANDIDATE: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_START)
}

fn is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// `count` distinct loopback ports that are free for TCP and UDP now and
/// that no outgoing connection will take.
pub fn free_loopback_ports(count: usize) -> io::Result<Vec<u16>> {
    let end = ephemeral_start().max(LOWEST + 1);
    let candidates = u32::from(end - LOWEST);
    let offset = std::process::id().wrapping_mul(7_919) % candidates;
    let _first_pick =
        NEXT_CANDIDATE.compare_exchange(0, offset, Ordering::Relaxed, Ordering::Relaxed);
    let mut ports = Vec::with_capacity(count);
    for _ in 0..candidates {
        if ports.len() == count {
            return Ok(ports);
        }
        let step = NEXT_CANDIDATE.fetch_add(1, Ordering::Relaxed) % candidates;
        let port = LOWEST + step as u16;
        if is_free(port) {
            ports.push(port);
        }
    }
    if ports.len() == count {
        return Ok(ports);
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("fewer than {count} free loopback ports below {end}"),
    ))
}
/// The first of `len` consecutive loopback ports that are all free now,
/// for a command that takes a base port and counts up from it (`floret
/// dev`); none of them is handed out again by this process.
pub fn free_loopback_range(len: u16) -> io::Result<u16> {
    let end = ephemeral_start().max(LOWEST + len);
    let candidates = u32::from(end - LOWEST - len + 1);
    let offset = std::process::id().wrapping_mul(7_919) % candidates;
    let _first_pick =
        NEXT_CANDIDATE.compare_exchange(0, offset, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..candidates / u32::from(len.max(1)) + 1 {
        let step = NEXT_CANDIDATE.fetch_add(u32::from(len), Ordering::Relaxed) % candidates;
        let first = LOWEST + step as u16;
        if (first..first + len).all(is_free) {
            return Ok(first);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no {len} consecutive free loopback ports below {end}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_port_taken_by_an_outgoing_connection() {
        let picked = free_loopback_ports(4).unwrap();
        let again = free_loopback_ports(4).unwrap();
        let start = ephemeral_start();
        for port in picked.iter().chain(&again) {
            assert!(*port < start, "{port} is in the ephemeral range");
        }
        let all: std::collections::BTreeSet<_> = picked.iter().chain(&again).collect();
        assert_eq!(all.len(), 8, "a port was handed out twice");
    }
}
