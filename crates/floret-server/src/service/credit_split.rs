//! How a merged consumer's credits are split between nodes: each credit
//! goes to the node that is furthest behind its weighted share (stride
//! scheduling), so over time every node receives credits, and so delivers,
//! in proportion to its weight: the backlogged weight it reports on its
//! consume stream. A node that was not eligible starts level with the others
//! when it becomes eligible again, so it neither starves them nor bursts.
//! And no node is ever more than [`MAX_LEAD_CREDITS`] ahead of the one
//! furthest behind, at its current weight: weights change scale (every
//! idle node weighs 1, a backlogged one its reported weight), and a lead
//! built up at weight 1, where a credit advances a node's pass by 1, took
//! a thousand credits to work off at weight 500; the nodes it was ahead
//! of went without credits for seconds meanwhile.
//!
//! Pure bookkeeping: no I/O, no clock.
//!
//! IMPLEMENTATION CAVEATS
//! - Passes are floating point; they are rebased when they grow large, so
//!   long-lived consumers do not lose precision.

/// Passes above this are rebased towards zero.
const REBASE_ABOVE: f64 = 1e12;

/// How many credits, at its current weight, a source's pass may be ahead of
/// the lowest one: in steady state passes stay within one credit of each
/// other, so this only trims leads left over from other weights.
const MAX_LEAD_CREDITS: f64 = 2.0;

/// Splits credits between sources by weight.
#[derive(Debug, Clone)]
pub struct CreditSplit {
    /// Virtual time of each source: advances by 1/weight per credit given.
    passes: Vec<f64>,
    /// Whether each source was eligible at the last split.
    eligible: Vec<bool>,
}

impl CreditSplit {
    /// A split over `sources` sources.
    pub fn new(sources: usize) -> Self {
        Self {
            passes: vec![0.0; sources],
            eligible: vec![false; sources],
        }
    }

    /// Adds one more source (a node that joined): it starts level with
    /// the others once it has weight.
    pub fn add_source(&mut self) {
        self.passes.push(0.0);
        self.eligible.push(false);
    }

    /// Gives `credits` credits to the sources with weight > 0, in proportion
    /// to their weights; returns how many each gets.
    pub fn split(&mut self, credits: u64, weights: &[u64]) -> Vec<u64> {
        debug_assert_eq!(weights.len(), self.passes.len());
        let mut grants = vec![0; weights.len()];
        let eligible: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0).collect();
        let Some(level) = eligible
            .iter()
            .filter(|&&i| self.eligible[i])
            .map(|&i| self.passes[i])
            .reduce(f64::min)
            .or_else(|| eligible.iter().map(|&i| self.passes[i]).reduce(f64::min))
        else {
            self.eligible.fill(false);
            return grants;
        };
        for (i, was_eligible) in self.eligible.iter_mut().enumerate() {
            let now_eligible = weights[i] > 0;
            if now_eligible && !*was_eligible {
                self.passes[i] = self.passes[i].max(level);
            }
            *was_eligible = now_eligible;
        }
        let level = eligible
            .iter()
            .map(|&i| self.passes[i])
            .fold(f64::INFINITY, f64::min);
        for &i in &eligible {
            self.passes[i] = self.passes[i].min(level + MAX_LEAD_CREDITS / weights[i] as f64);
        }
        for _ in 0..credits {
            let next = eligible
                .iter()
                .copied()
                .min_by(|&a, &b| self.passes[a].total_cmp(&self.passes[b]).then(a.cmp(&b)))
                .expect("eligible is not empty");
            grants[next] += 1;
            self.passes[next] += 1.0 / weights[next] as f64;
        }
        if self.passes.iter().any(|&p| p > REBASE_ABOVE) {
            let floor = eligible
                .iter()
                .map(|&i| self.passes[i])
                .fold(f64::INFINITY, f64::min);
            for pass in &mut self.passes {
                *pass = (*pass - floor).max(0.0);
            }
        }
        grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_follow_weights() {
        let mut split = CreditSplit::new(3);
        let grants = split.split(1_000, &[1, 9, 0]);
        assert_eq!(grants, [100, 900, 0]);
    }

    #[test]
    fn small_grants_add_up_to_the_weighted_share() {
        let mut split = CreditSplit::new(2);
        let mut total = [0u64; 2];
        for _ in 0..400 {
            let grants = split.split(1, &[1, 3]);
            total[0] += grants[0];
            total[1] += grants[1];
        }
        assert_eq!(total, [100, 300]);
    }

    #[test]
    fn returning_source_does_not_burst() {
        let mut split = CreditSplit::new(2);
        split.split(1_000, &[1, 1]);
        split.split(1_000, &[0, 1]);
        let grants = split.split(100, &[1, 1]);
        assert_eq!(grants, [50, 50]);
    }

    #[test]
    fn a_lead_built_at_weight_one_does_not_starve_the_others_at_real_weights() {
        // While nothing is backlogged every node weighs 1 and a credit moves
        // its pass by a whole 1, so the remote nodes can end that phase a
        // credit ahead of the local one (a soak caught 17 against 18). At
        // weights in the hundreds, a lead of 1 is hundreds of credits.
        let mut split = CreditSplit::new(3);
        split.split(3, &[1, 1, 1]);
        split.passes = vec![17.0, 18.0, 18.0];
        let grants = split.split(100, &[500, 250, 250]);
        assert!(
            grants[1] >= 20 && grants[2] >= 20,
            "the remote nodes waited for the local one to work off their lead: {grants:?}"
        );
    }

    #[test]
    fn nothing_eligible_gives_nothing() {
        let mut split = CreditSplit::new(2);
        assert_eq!(split.split(10, &[0, 0]), [0, 0]);
    }
}
