//! Statistics shared by the trainer's bench binaries (`grpo-bench`,
//! `repair-bench`), included by each with `#[path]`: not part of the library.

/// The median: the middle value of an odd count, the mean of the two middle
/// values of an even one (NaN when empty).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
