//! SplitMix64: a tiny deterministic generator. Every random choice of a run is drawn from a
//! generator keyed by (run seed, step, purpose), so a resumed run draws exactly what an
//! uninterrupted one would, without saving generator state.

#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// A generator for `purpose` at `step` of the run seeded `seed`.
    pub fn keyed(seed: u64, step: u64, purpose: &str) -> Self {
        let mut h = seed ^ 0x243f_6a88_85a3_08d3;
        for b in purpose.bytes().chain(step.to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        let mut g = SplitMix(h);
        g.next_u64();
        g
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}
