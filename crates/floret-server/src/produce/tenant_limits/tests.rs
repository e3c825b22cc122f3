use super::*;

fn limits(max_messages: Option<u64>, max_bytes: Option<u64>) -> Policy {
    Policy {
        max_messages,
        max_bytes,
        ..Policy::default()
    }
}

#[test]
fn a_tenant_passes_its_limit_by_spreading_over_producers() {
    let ten = limits(Some(10), None);
    assert_eq!(check_stored("acme", &ten, (9, 900), (1, 100)), Ok(()));
    let refused = check_stored("acme", &ten, (9, 900), (2, 200)).unwrap_err();
    assert_eq!(refused.retry_after(), Some(OVER_LIMIT_RETRY_AFTER));
    let said = refused.to_string();
    assert!(
        said.contains("tenant \"acme\" stores 9 messages") && said.contains("max_messages 10"),
        "{said}"
    );
    let bytes = limits(None, Some(1_000));
    assert!(check_stored("acme", &bytes, (0, 950), (1, 100)).is_err());
}

#[test]
fn a_batch_over_the_tenants_limit_by_itself_is_invalid_not_retryable() {
    let never = check_stored("acme", &limits(Some(10), None), (0, 0), (11, 11)).unwrap_err();
    assert!(matches!(never, RequestError::Invalid(_)), "{never:?}");
    assert_eq!(never.retry_after(), None);
}

#[test]
fn one_node_asked_alone_gets_the_whole_rate() {
    assert_eq!(node_rate(100, 500.0, &[]), 100);
    assert_eq!(node_rate(100, 0.0, &[]), 100);
}

#[test]
fn nodes_share_a_tenants_rate_so_that_together_they_never_pass_it() {
    // Two nodes flooded alike: half each.
    assert_eq!(node_rate(100, 500.0, &[500.0]), 50);
    // A node asked little keeps what it asks; the flooded one gets the rest.
    assert_eq!(node_rate(100, 10.0, &[500.0]), 10);
    assert_eq!(node_rate(100, 500.0, &[10.0]), 90);
    // Three nodes, one quiet: the quiet one's need first, the others even.
    assert_eq!(node_rate(90, 300.0, &[300.0, 6.0]), 42);
    // Asked for less than the rate together: this node may take the rest.
    assert_eq!(node_rate(100, 20.0, &[30.0]), 70);
    let parts: u32 = [
        node_rate(100, 500.0, &[80.0, 20.0]),
        node_rate(100, 80.0, &[500.0, 20.0]),
        node_rate(100, 20.0, &[500.0, 80.0]),
    ]
    .iter()
    .sum();
    assert!(
        parts <= 102,
        "parts add up to the rate (rounded up): {parts}"
    );
}

#[test]
fn demand_is_the_last_windows_rate_or_the_current_count_and_fades_when_idle() {
    let start = Instant::now();
    let mut demand = Demand::new(start);
    demand.record(30, start);
    assert_eq!(demand.rate(start), 30.0, "a first burst counts at once");
    demand.record(70, start + Duration::from_millis(500));
    let after_a_window = start + Duration::from_millis(1_000);
    assert_eq!(demand.rate(after_a_window), 100.0);
    demand.record(10, after_a_window);
    assert_eq!(
        demand.rate(after_a_window),
        100.0,
        "the last whole window until the current one counts more"
    );
    let idle = after_a_window + Duration::from_secs(3);
    assert_eq!(demand.rate(idle), 0.0);
    assert_eq!(
        demand.idle_since(),
        idle,
        "rolled once more over its last count"
    );
    assert_eq!(demand.rate(idle + Duration::from_secs(5)), 0.0);
    assert_eq!(demand.idle_since(), idle, "and then stays idle");
}
