//! Nearest-rank percentiles of measured durations, for the benches that print them
//! (`followers`, `invalidation`), which include this file with `#[path]`.

use std::time::Duration;

/// The nearest-rank percentile `p` (1..=100) of `samples`, in ms (0 if there are none).
pub fn percentile_ms(samples: &[Duration], p: usize) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    if n == 0 {
        return 0.0;
    }
    let rank = (p * n).div_ceil(100).clamp(1, n);
    sorted[rank - 1].as_secs_f64() * 1000.0
}
