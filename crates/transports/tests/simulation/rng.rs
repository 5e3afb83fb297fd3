//! The simulation's one source of choices: SplitMix64, seeded per run. Every
//! random decision of a seed (the operations, the engine's behaviour, the
//! destination's failures, latencies) is drawn from one of these, so a seed
//! replays the same schedule.

#[derive(Debug, Clone)]
pub(crate) struct Rng {
    state: u64,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng { state: seed ^ 0x5eed_1e70_0dd5_eed5 }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index in `0..n`.
    pub(crate) fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    /// True `percent` times in a hundred.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `choices`, each as likely as its weight.
    pub(crate) fn weighted<T: Copy>(&mut self, choices: &[(u64, T)]) -> T {
        let total: u64 = choices.iter().map(|(w, _)| w).sum();
        let mut at = self.below(total);
        for (weight, choice) in choices {
            if at < *weight {
                return *choice;
            }
            at -= weight;
        }
        choices[choices.len() - 1].1
    }
}
