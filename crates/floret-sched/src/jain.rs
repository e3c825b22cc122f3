//! Jain's fairness index, the one measure of "how equal were the shares"
//! that the queue statistics, `floret bench` and the chaos checker report.

/// Jain's fairness index of `shares`: 1 when all are equal, 1/n when one
/// has everything; None for no shares or only zeros.
pub fn jain_index(shares: &[f64]) -> Option<f64> {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|share| share * share).sum();
    (!shares.is_empty() && squares > 0.0).then(|| sum * sum / (shares.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() {
        assert_eq!(jain_index(&[3.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(jain_index(&[9.0, 0.0, 0.0]), Some(1.0 / 3.0));
        assert_eq!(jain_index(&[]), None);
        assert_eq!(jain_index(&[0.0, 0.0]), None);
    }
}
