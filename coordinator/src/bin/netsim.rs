//! Network simulator bench (issue 16 item 5): [`coordinator::sim`] over the
//! sans-IO core at several network sizes, seeded, no model.
//!
//! `netsim --economics [WINDOWS] [SEEDS]` (defaults 20 windows, 5 seeds)
//! prints issue 28's tables instead: each cheater strategy
//! ([`coordinator::sim::Strategy`]) against sixteen honest miners, with 1, 2
//! and 3 validators, at two validator budgets (docs/benchmarks.md section 5b).
//!
//! `netsim [N[,N...]] [WINDOWS] [SEEDS]` (defaults `10,100,1000,10000 20`;
//! SEEDS defaults to ⌈1000/N⌉ runs per size, at most 20, one at N ≥ 1000);
//! `netsim --help` says so. Each size runs [`SimConfig::network`]: two
//! honest twins, 10 % lazy miners (half their groups), 20 % cheaters (1 %,
//! 5 %, 25 %, 100 % of rollouts), the rest honest; 32 groups of 16 rollouts
//! per miner per window; committees of 2 (one prover, one confirmer on
//! demand); validators of 4096 rollouts each, enough for one group of every
//! miner. Memory is what the process holds (a counting allocator): at its
//! peak (a window's door bookkeeping full) and after the last window
//! closed, both divided by N.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use coordinator::sim::{Sim, SimConfig, SimReport, Strategy, economics};
use coordinator::weights::PAY_DELAY_WINDOWS;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn arg<T: std::str::FromStr>(i: usize) -> Option<T> {
    std::env::args().nth(i).and_then(|s| s.parse().ok())
}

const HELP: &str = "\
netsim: the network simulator over the coordinator's sans-IO core (issue 16), seeded, no model.

usage: netsim [N[,N...]] [WINDOWS] [SEEDS]
       netsim --economics [WINDOWS] [SEEDS]
       netsim --help

  N        miners per network, comma-separated (default 10,100,1000,10000)
  WINDOWS  windows simulated per run (default 20)
  SEEDS    runs per size (default ceil(1000/N), at most 20)

Each network: two identical honest miners, 10 % lazy, 20 % cheaters (1, 5, 25, 100 % of
rollouts), the rest honest; 32 groups of 16 rollouts per miner; committees of 2 (one
prover, one confirmer on demand); validators of 4096 rollouts, enough for one group of
every miner. Prints a markdown table (docs/benchmarks.md section 5).

--economics: each cheater strategy (fake tokens at 1, 10, 100 %; a reward nudged inside
the old 1e-6 tolerance; group subsets; a validator colluding with a cheater; 8 Sybil keys storing
garbage) against 16 honest miners, with 1, 2 and 3 validators (the first colluding where
the strategy has one), at the default validator budget (4096) and at two groups of every
miner, pay delayed as the signed documents delay it (and, at two groups, not delayed);
WINDOWS windows (default 20) x SEEDS runs (default 5). Prints the cheater's
earnings / an honest miner's, windows until ban, honest false bans, trainer proofs wasted
(docs/benchmarks.md section 5b).
";

/// Issue 28 item 9: the economics table, at the default validator budget
/// (4096 rollouts) and at two groups of every miner per window, pay as the
/// signed documents pay it (delayed by `PAY_DELAY_WINDOWS`); then at two
/// groups with pay not delayed (the rule before).
fn print_economics(windows: u64, seeds: u64) {
    let d = PAY_DELAY_WINDOWS;
    for (title, budget, delay) in [
        (
            format!("validator budget 4096 (the default); pay delayed by {d} windows (the signed documents)"),
            Some(4096),
            d,
        ),
        (
            format!("validator budget: two groups of every miner; pay delayed by {d} windows (the signed documents)"),
            None,
            d,
        ),
        ("validator budget: two groups of every miner; pay not delayed (the rule before)".to_owned(), None, 0),
    ] {
        println!("{title}; {windows} windows x {seeds} seeds:");
        println!();
        economics_table(windows, seeds, budget, delay);
        println!();
    }
}

fn economics_table(windows: u64, seeds: u64, budget: Option<u32>, delay: u64) {
    println!(
        "| strategy | V | cheater ÷ honest earnings (goal ≤ 0.05) | windows to ban (mean; never / keys) | honest false bans | trainer groups wasted / window (of proved) | colluder flagged (runs) | honest validator flagged (runs) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for strategy in Strategy::ALL {
        for validators in 1..=3 {
            let r = economics(strategy, validators, windows, seeds, budget, delay);
            let ban = r.windows_to_ban.map_or("-".to_owned(), |b| format!("{b:.2}"));
            let colluder = if matches!(strategy, Strategy::Colluding(_)) {
                format!("{}/{}", r.colluder_flagged, r.runs)
            } else {
                "-".to_owned()
            };
            println!(
                "| {} | {validators} | {:.4} | {ban}; {}/{} | {} | {:.2} ({:.2}) | {colluder} | {}/{} |",
                strategy.name(),
                r.earnings_ratio,
                r.never_banned,
                r.cheaters,
                r.false_bans,
                r.wasted_per_window,
                r.trainer_per_window,
                r.honest_flagged,
                r.runs,
            );
        }
    }
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("--economics") {
        print_economics(arg(2).unwrap_or(20), arg(3).unwrap_or(5));
        return;
    }
    let sizes: Vec<usize> = std::env::args()
        .nth(1)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 100, 1000, 10_000]);
    let windows: u64 = arg(2).unwrap_or(20);
    let seeds_arg: Option<u64> = arg(3);
    println!(
        "| N | V | windows × seeds | honest rollouts → trainer | P(cheater caught / window): by validators, in all | windows to ban (mean, max; never) | false bans | validator ÷ miner compute (confirmations) | coordinator MiB peak (KiB / miner) | KiB / miner after | twin spread (worst; ≤ 1.2) | lazy ÷ twin weight | seconds |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut detection: Vec<String> = Vec::new();
    for n in sizes {
        let seeds = seeds_arg.unwrap_or_else(|| (1000u64.div_ceil(n as u64)).clamp(1, 20));
        let started = Instant::now();
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let mut all: Vec<SimReport> = Vec::new();
        let mut after = 0usize;
        let mut validators = 0;
        let mut prove_cost = 0.0;
        for seed in 0..seeds {
            let cfg = SimConfig { windows, ..SimConfig::network(n, seed) };
            validators = cfg.validators;
            prove_cost = cfg.prove_cost;
            let mut sim = match Sim::new(cfg) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("bad schedule: {e}");
                    return;
                }
            };
            all.push(sim.run());
            after = after.max(LIVE.load(Ordering::Relaxed).saturating_sub(base));
            drop(sim);
        }
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        let sum = |f: &dyn Fn(&SimReport) -> u64| all.iter().map(f).sum::<u64>();
        let trained = sum(&|r| r.honest_trained) as f64 / sum(&|r| r.honest_rollouts).max(1) as f64;
        let caught = sum(&|r| r.cheat_windows_caught) as f64 / sum(&|r| r.cheat_windows).max(1) as f64;
        let by_validators =
            sum(&|r| r.cheat_windows_caught_by_validators) as f64 / sum(&|r| r.cheat_windows).max(1) as f64;
        let bans: Vec<u64> = all.iter().flat_map(|r| r.windows_to_ban.iter().flatten().copied()).collect();
        let never = all.iter().flat_map(|r| r.windows_to_ban.iter()).filter(|b| b.is_none()).count();
        let mean_ban = bans.iter().sum::<u64>() as f64 / bans.len().max(1) as f64;
        let max_ban = bans.iter().max().copied().unwrap_or(0);
        let false_bans = sum(&|r| r.false_bans);
        let compute = sum(&|r| r.proved) as f64 * prove_cost / sum(&|r| r.generated).max(1) as f64;
        let confirming = sum(&|r| r.confirmed) as f64 * prove_cost / sum(&|r| r.generated).max(1) as f64;
        let spreads: Vec<f64> = all.iter().map(SimReport::twin_spread).collect();
        let worst = spreads.iter().copied().fold(1.0, f64::max);
        let within = spreads.iter().filter(|s| **s <= 1.2).count();
        let lazy: Vec<f64> = all.iter().filter_map(|r| r.lazy_ratio).collect();
        let lazy = lazy.iter().sum::<f64>() / lazy.len().max(1) as f64;
        let mut rates: std::collections::BTreeMap<u32, (u64, u64, u64)> = std::collections::BTreeMap::new();
        for (rate, (c, v, a)) in all.iter().flat_map(|r| r.by_rate.iter()) {
            let e = rates.entry(*rate).or_default();
            e.0 += c;
            e.1 += v;
            e.2 += a;
        }
        let cells: Vec<String> = rates
            .iter()
            .map(|(rate, (c, v, a))| {
                let p = |x: &u64| *x as f64 / (*c).max(1) as f64;
                format!("{:.1} %: {:.3}, {:.3}", f64::from(*rate) / 10.0, p(v), p(a))
            })
            .collect();
        detection.push(format!("| {n} | {} |", cells.join(" | ")));
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        println!(
            "| {n} | {validators} | {windows} × {seeds} | {:.1} % | {by_validators:.3}, {:.3} | {mean_ban:.2}, {max_ban}; {never} | {false_bans} | {compute:.4} ({confirming:.4}) | {:.1} ({:.1}) | {:.2} | {worst:.3} ({within}/{}) | {lazy:.4} | {:.1} |",
            trained * 100.0,
            caught,
            mib(peak),
            peak as f64 / 1024.0 / n as f64,
            after as f64 / 1024.0 / n as f64,
            spreads.len(),
            started.elapsed().as_secs_f64(),
        );
    }
    println!();
    println!("P(cheater caught per window) by cheating rate: by validators, in all (the trainer's gate included)");
    println!();
    for row in detection {
        println!("{row}");
    }
}
