//! The merge of unwritten changes over sled, write-outs and installs.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use super::merged::Merged;
use super::*;

fn tree_with(stored: &[(&str, &str)]) -> (tempfile::TempDir, ShardTree) {
    let dir = tempfile::tempdir().unwrap();
    let tree = sled::open(dir.path()).unwrap().open_tree("t").unwrap();
    for (key, value) in stored {
        tree.insert(key.as_bytes(), value.as_bytes()).unwrap();
    }
    (dir, ShardTree::open(tree).unwrap().0)
}

fn changes(set: &[(&str, Option<&str>)]) -> ChangeSet {
    let mut changes = ChangeSet::default();
    for (key, value) in set {
        match value {
            Some(value) => changes.insert(key.as_bytes().to_vec(), value.as_bytes().to_vec()),
            None => changes.remove(key.as_bytes().to_vec()),
        }
    }
    changes
}

fn listed(items: impl Iterator<Item = sled::Result<Pair>>) -> Vec<(String, String)> {
    items
        .map(|item| {
            let (key, value) = item.unwrap();
            (
                String::from_utf8(key.to_vec()).unwrap(),
                String::from_utf8(value.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn unwritten_change_hides_the_stored_value_until_written_out() {
    let (_dir, tree) = tree_with(&[("a", "old"), ("b", "kept")]);
    tree.apply(changes(&[("a", Some("new")), ("b", None)]))
        .unwrap();
    assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"new");
    assert_eq!(tree.get(b"b").unwrap(), None);
    assert_eq!(tree.tree.get(b"a").unwrap().unwrap().as_ref(), b"old");
    tree.write_out().unwrap();
    assert_eq!(tree.tree.get(b"a").unwrap().unwrap().as_ref(), b"new");
    assert_eq!(tree.tree.get(b"b").unwrap(), None);
    assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"new");
}

#[test]
fn message_produced_and_acked_between_write_outs_never_reaches_sled() {
    let (_dir, tree) = tree_with(&[]);
    tree.apply(changes(&[("m1", Some("run"))])).unwrap();
    tree.apply(changes(&[("m1", None)])).unwrap();
    assert!(
        tree.unwritten().pending.is_empty(),
        "no deletion is kept for a key sled never had"
    );
    tree.write_out().unwrap();
    assert_eq!(tree.tree.len(), 0);
    assert_eq!(tree.get(b"m1").unwrap(), None);
}

#[test]
fn churn_of_produced_and_acked_messages_does_not_force_write_outs() {
    let (_dir, tree) = tree_with(&[]);
    let run = "r".repeat(1000);
    for message in 0..2 * WRITE_OUT_BYTES / run.len() {
        let key = format!("m{message}");
        tree.apply(changes(&[(&key, Some(&run))])).unwrap();
        let unwritten = tree.apply(changes(&[(&key, None)])).unwrap();
        assert_eq!(unwritten, 0, "message {message} left bytes behind");
    }
    let unwritten = tree
        .apply(changes(&[("p", Some("counters")), ("p", Some("more"))]))
        .unwrap();
    assert_eq!(unwritten, "p".len() + "more".len());
}

#[test]
fn ranges_merge_unwritten_changes_with_stored_pairs_both_ways() {
    let (_dir, tree) = tree_with(&[("a", "1"), ("c", "3"), ("e", "5"), ("g", "7")]);
    tree.apply(changes(&[
        ("b", Some("2")),
        ("c", None),
        ("e", Some("five")),
        ("h", Some("8")),
    ]))
    .unwrap();
    assert_eq!(
        listed(tree.iter()),
        pairs(&[
            ("a", "1"),
            ("b", "2"),
            ("e", "five"),
            ("g", "7"),
            ("h", "8")
        ])
    );
    assert_eq!(
        listed(tree.range(Bound::Excluded(b"a"), Bound::Included(b"g"))),
        pairs(&[("b", "2"), ("e", "five"), ("g", "7")])
    );
    let last = |from: &str, to: &str| {
        tree.last_in(from.as_bytes(), to.as_bytes())
            .unwrap()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
    };
    assert_eq!(last("a", "d"), Some((b"b".to_vec(), b"2".to_vec())));
    assert_eq!(
        last("c", "d"),
        None,
        "a deleted stored key must not come back"
    );
    assert_eq!(last("a", "z"), Some((b"h".to_vec(), b"8".to_vec())));
}

#[test]
fn prefix_scan_stops_at_the_prefix_end() {
    let (_dir, tree) = tree_with(&[("pa", "1"), ("q", "x")]);
    tree.apply(changes(&[("pb", Some("2")), ("r", Some("y"))]))
        .unwrap();
    assert_eq!(
        listed(tree.scan_prefix(b"p")),
        pairs(&[("pa", "1"), ("pb", "2")])
    );
}

#[test]
fn changes_applied_after_a_write_out_go_into_the_next() {
    let (_dir, tree) = tree_with(&[]);
    tree.apply(changes(&[("a", Some("1"))])).unwrap();
    tree.write_out().unwrap();
    tree.apply(changes(&[("a", Some("2")), ("b", Some("3"))]))
        .unwrap();
    assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"2");
    tree.write_out().unwrap();
    assert_eq!(tree.tree.get(b"a").unwrap().unwrap().as_ref(), b"2");
    assert_eq!(tree.tree.get(b"b").unwrap().unwrap().as_ref(), b"3");
}

#[test]
fn snapshot_install_drops_unwritten_changes() {
    let (_dir, tree) = tree_with(&[("old", "1")]);
    tree.apply(changes(&[("gone", Some("2"))])).unwrap();
    tree.replace_all([(b"new".to_vec(), b"3".to_vec())])
        .unwrap();
    assert_eq!(listed(tree.iter()), pairs(&[("new", "3")]));
    tree.write_out().unwrap();
    assert_eq!(listed(tree.iter()), pairs(&[("new", "3")]));
}

#[test]
fn long_ranges_over_both_layers_read_like_one_map() {
    let key = |n: u32| format!("k{n:03}");
    let stored: Vec<(String, String)> = (0..100).step_by(2).map(|n| (key(n), "s".into())).collect();
    let stored_refs: Vec<(&str, &str)> = stored
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (_dir, tree) = tree_with(&stored_refs);
    let mut model: BTreeMap<String, String> = stored.iter().cloned().collect();
    let mut being_written = ChangeSet::default();
    for n in (0..100).filter(|n| n % 5 == 0) {
        being_written.insert(key(n).into_bytes(), b"w".to_vec());
        model.insert(key(n), "w".into());
    }
    tree.unwritten().being_written = Some(Arc::new(being_written));
    let mut pending = ChangeSet::default();
    for n in 0..100 {
        if n % 3 == 0 {
            pending.remove(key(n).into_bytes());
            model.remove(&key(n));
        } else if n % 2 == 1 {
            pending.insert(key(n).into_bytes(), b"p".to_vec());
            model.insert(key(n), "p".into());
        }
    }
    tree.unwritten().pending = pending;
    let expected: Vec<(String, String)> = model.into_iter().collect();
    assert_eq!(listed(tree.iter()), expected);
    let mut reversed = expected.clone();
    reversed.reverse();
    let backwards = Merged::new(&tree, Bound::Unbounded, Bound::Unbounded, true);
    assert_eq!(listed(backwards), reversed);
    let (from, to) = (key(17), key(83));
    let within: Vec<_> = expected
        .iter()
        .filter(|(k, _)| *k >= from && *k <= to)
        .cloned()
        .collect();
    let range = tree.range(
        Bound::Included(from.as_bytes()),
        Bound::Included(to.as_bytes()),
    );
    assert_eq!(listed(range), within);
    let last = tree
        .last_in(from.as_bytes(), to.as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(last.0.as_ref(), within.last().unwrap().0.as_bytes());
}

/// A snapshot's capture iterates a shard's tree while a node-wide
/// durability sync writes that tree's changes out. sled's iterator keeps
/// the leaf it loaded; once the write-out had moved the changes into sled
/// and out of the unwritten layers, the iteration yielded that leaf's old
/// values. A replica installed the image and stopped on a producer record
/// that no longer matched its messages.
#[test]
fn range_read_across_a_write_out_never_yields_values_from_before_it() {
    let keys: Vec<String> = (0..100).map(|i| format!("k{i:03}")).collect();
    let stored: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "old")).collect();
    let every_other: Vec<(&str, Option<&str>)> = keys
        .iter()
        .step_by(2)
        .map(|k| (k.as_str(), Some("new")))
        .collect();
    let expected: Vec<(String, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                k.clone(),
                if i % 2 == 0 { "new" } else { "old" }.to_string(),
            )
        })
        .collect();
    for reverse in [false, true] {
        for read_before_write_out in 0..keys.len() {
            let (_dir, tree) = tree_with(&stored);
            tree.apply(changes(&every_other)).unwrap();
            let mut range = Merged::new(&tree, Bound::Unbounded, Bound::Unbounded, reverse);
            let mut seen = listed(range.by_ref().take(read_before_write_out));
            tree.write_out().unwrap();
            seen.extend(listed(range));
            if reverse {
                seen.reverse();
            }
            assert_eq!(
                seen, expected,
                "reverse {reverse}, written out after {read_before_write_out} pairs"
            );
        }
    }
}
