//! `busway bench --baseline FILE`: this run's throughput rows beside a baseline kept in a file
//! (the repo keeps `bench/baseline.json`; `.ci/run` checks it), and a regression named when a
//! row's ratio to raw fell by more than the tolerance. `--save-baseline FILE` writes one.
//!
//! What is compared is each row's ratio to the raw baseline of the same run (the median of its
//! rounds' ratios, each round's busway rate over the raw rate of the round beside it), not its
//! rate: a slower or busier machine slows both sides alike. Ratios still differ from one CPU
//! to another (0.35 × raw on one VM's Intel CPU, 0.6-0.8 × on another's AMD), so a file holds
//! one baseline per machine (its CPU model and core count), and a run on a machine the file
//! does not know is printed, not judged. A row whose rounds spread too much to tell a
//! regression from noise is printed as such, not judged either.

use super::Row;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// How far the judged rows' ratios may fall below their baselines together (the geometric
/// mean of their changes) before the run counts as a regression, as a fraction (0.10: 10 %).
/// A change in a path every row takes (the send path) moves them all; one row's noise moves
/// the mean by a fraction of itself.
pub(super) const TOLERANCE_DEFAULT: f64 = 0.10;

/// A single row fails on its own only past this many times the tolerance: one row's median
/// still moves by 10-15 % from run to run on a noisy 2-core VM.
const ROW_TOLERANCE_FACTOR: f64 = 3.0;

/// The largest spread of a row's round ratios (their interquartile range over their median)
/// that is judged: past it the rounds disagree more than the change looked for.
pub(super) const SPREAD_JUDGED_MAX: f64 = 0.5;

/// A file of baselines, one per machine.
#[derive(Serialize, Deserialize, Debug, Default)]
struct BaselineFile {
    machines: Vec<MachineBaseline>,
}

/// The rows measured on one machine.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct MachineBaseline {
    /// `sysinfo::machine_key`: CPU model and core count.
    machine: String,
    /// The command that measured them.
    command: String,
    rows: Vec<BaselineRow>,
}

/// One throughput row's ratio to raw, and the spread of its rounds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct BaselineRow {
    transport: String,
    size_min: usize,
    size_max: usize,
    api: String,
    io: String,
    ratio: f64,
    spread: f64,
}

impl BaselineRow {
    fn of(row: &Row) -> Self {
        let (ratio, spread) = ratio_and_spread(&row.round_ratios);
        Self {
            transport: row.transport.clone(),
            size_min: row.size_min,
            size_max: row.size_max,
            api: row.api.clone(),
            io: row.io.clone(),
            ratio,
            spread,
        }
    }

    fn same_row(&self, other: &Self) -> bool {
        (
            &self.transport,
            self.size_min,
            self.size_max,
            &self.api,
            &self.io,
        ) == (
            &other.transport,
            other.size_min,
            other.size_max,
            &other.api,
            &other.io,
        )
    }

    fn name(&self) -> String {
        format!(
            "{} {}-{} {} io {}",
            self.transport, self.size_min, self.size_max, self.api, self.io
        )
    }
}

/// The median of round ratios, and their spread (the interquartile range over the median:
/// one stray round does not make a row unjudgeable).
fn ratio_and_spread(ratios: &[f64]) -> (f64, f64) {
    let mut v = ratios.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let Some(&median) = v.get(v.len() / 2) else {
        return (0.0, 0.0);
    };
    let (q1, q3) = (v[v.len() / 4], v[(3 * v.len()) / 4]);
    (median, (q3 - q1) / median.max(f64::MIN_POSITIVE))
}

/// What one row of this run is, beside its baseline.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Within the tolerance.
    Held,
    /// Better than its baseline by more than the tolerance (time to save a new one).
    Better,
    /// Below its baseline by more than the tolerance.
    Regressed,
    /// Its rounds spread too much to be judged.
    Noisy,
    /// The baseline has no such row.
    New,
}

/// Each row of `now` beside `base`: its verdict and its printed line; and the geometric
/// mean of the judged rows' changes (`None` if no row was judged).
fn judge(
    now: &[BaselineRow],
    base: &[BaselineRow],
    tolerance: f64,
) -> (Vec<(Verdict, String)>, Option<f64>) {
    let mut log_sum = 0.0;
    let mut judged = 0;
    let rows = now
        .iter()
        .map(|n| {
            let Some(b) = base.iter().find(|b| b.same_row(n)) else {
                let line = format!("{:32} {:>8} {:>8.3}", n.name(), "-", n.ratio);
                return (Verdict::New, line);
            };
            let change = n.ratio / b.ratio.max(f64::MIN_POSITIVE) - 1.0;
            let verdict = if n.spread > SPREAD_JUDGED_MAX || n.ratio <= 0.0 {
                Verdict::Noisy
            } else {
                log_sum += (1.0 + change).ln();
                judged += 1;
                if change < -tolerance * ROW_TOLERANCE_FACTOR {
                    Verdict::Regressed
                } else if change > tolerance * ROW_TOLERANCE_FACTOR {
                    Verdict::Better
                } else {
                    Verdict::Held
                }
            };
            let line = format!(
                "{:32} {:>8.3} {:>8.3} {:>+7.1}% {:>6.0}%",
                n.name(),
                b.ratio,
                n.ratio,
                100.0 * change,
                100.0 * n.spread
            );
            (verdict, line)
        })
        .collect();
    let mean = (judged > 0).then(|| (log_sum / judged as f64).exp() - 1.0);
    (rows, mean)
}

fn read(path: &Path) -> Result<BaselineFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--baseline {}: cannot read it: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "--baseline {}: not a baseline file (as --save-baseline writes): {e}",
            path.display()
        )
    })
}

/// Compares `rows` with the baseline of this machine in `path`: prints the comparison on
/// stderr and returns whether no row regressed by more than `tolerance`.
pub(super) fn check(path: &Path, rows: &[Row], tolerance: f64) -> Result<bool, String> {
    let file = read(path)?;
    let machine = super::sysinfo::machine_key();
    let Some(base) = file.machines.iter().find(|m| m.machine == machine) else {
        let known: Vec<&str> = file.machines.iter().map(|m| m.machine.as_str()).collect();
        eprintln!(
            "busway bench: {} holds no baseline for this machine ({machine}; it has {known:?}): not judged. Save one with --save-baseline.",
            path.display()
        );
        return Ok(true);
    };
    let now: Vec<BaselineRow> = rows.iter().map(BaselineRow::of).collect();
    let (judged, mean) = judge(&now, &base.rows, tolerance);
    let mut out = format!(
        "beside {} ({machine}); a row alone fails {:.0}% below its baseline, the judged rows together {:.0}% (geometric mean); rows whose rounds spread over {:.0}% (interquartile range over median) are not judged\n{:32} {:>8} {:>8} {:>8} {:>7}  verdict\n",
        path.display(),
        100.0 * tolerance * ROW_TOLERANCE_FACTOR,
        100.0 * tolerance,
        100.0 * SPREAD_JUDGED_MAX,
        "row (busway/raw)",
        "baseline",
        "now",
        "change",
        "spread"
    );
    for (verdict, line) in &judged {
        let word = match verdict {
            Verdict::Held => "held",
            Verdict::Better => "better (save a new baseline)",
            Verdict::Regressed => "REGRESSED",
            Verdict::Noisy => "too noisy to judge",
            Verdict::New => "new row, not in the baseline",
        };
        let _ = writeln!(out, "{line}  {word}");
    }
    let regressed = judged
        .iter()
        .filter(|(v, _)| *v == Verdict::Regressed)
        .count();
    let together_regressed = mean.is_some_and(|m| m < -tolerance);
    match mean {
        Some(m) => {
            let word = if together_regressed {
                "REGRESSED"
            } else {
                "held"
            };
            let _ = writeln!(
                out,
                "{:32} {:>8} {:>8} {:>+7.1}%          {word}",
                "judged rows together",
                "",
                "",
                100.0 * m
            );
        }
        None => {
            let _ = writeln!(
                out,
                "no row could be judged: every one spread too much or is new"
            );
        }
    }
    if regressed > 0 || together_regressed {
        let _ = writeln!(
            out,
            "busway bench: slower than the baseline: {regressed} row(s) alone{}",
            if together_regressed {
                ", and the judged rows together"
            } else {
                ""
            }
        );
    }
    eprint!("{out}");
    Ok(regressed == 0 && !together_regressed)
}

/// Writes `rows` into `path` as this machine's baseline (replacing its earlier one, keeping
/// other machines'), measured by `command`.
pub(super) fn save(path: &Path, rows: &[Row], command: String) -> Result<(), String> {
    let mut file = if path.exists() {
        read(path)?
    } else {
        BaselineFile::default()
    };
    let machine = super::sysinfo::machine_key();
    file.machines.retain(|m| m.machine != machine);
    file.machines.push(MachineBaseline {
        machine,
        command,
        rows: rows.iter().map(BaselineRow::of).collect(),
    });
    file.machines.sort_by(|a, b| a.machine.cmp(&b.machine));
    let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n")
        .map_err(|e| format!("--save-baseline {}: {e}", path.display()))?;
    eprintln!("busway bench: baseline written to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(transport: &str, ratio: f64, spread: f64) -> BaselineRow {
        BaselineRow {
            transport: transport.into(),
            size_min: 8,
            size_max: 128,
            api: "batch".into(),
            io: "current".into(),
            ratio,
            spread,
        }
    }

    #[test]
    fn a_row_far_below_its_baseline_or_all_rows_a_little_below_regress_unless_too_noisy() {
        let base = [row("shm", 1.0, 0.05), row("tcp4", 0.5, 0.05)];
        let verdicts = |now: &[BaselineRow]| {
            let (rows, mean) = judge(now, &base, 0.10);
            let v: Vec<Verdict> = rows.into_iter().map(|(v, _)| v).collect();
            (v, mean.map(|m| (m * 100.0).round()))
        };
        // One row 40 % down fails alone; the mean of -40 % and -8 % is -25 %.
        assert_eq!(
            verdicts(&[row("shm", 0.60, 0.05), row("tcp4", 0.46, 0.05)]),
            (vec![Verdict::Regressed, Verdict::Held], Some(-26.0))
        );
        // Both 15 % down: neither alone, but together past 10 %.
        assert_eq!(
            verdicts(&[row("shm", 0.85, 0.05), row("tcp4", 0.425, 0.05)]),
            (vec![Verdict::Held, Verdict::Held], Some(-15.0))
        );
        // A row whose rounds disagree is left out of the mean.
        assert_eq!(
            verdicts(&[row("shm", 0.50, 0.60), row("tcp4", 0.80, 0.05)]),
            (vec![Verdict::Noisy, Verdict::Better], Some(60.0))
        );
        assert_eq!(
            verdicts(&[row("mem", 0.1, 0.0)]),
            (vec![Verdict::New], None)
        );
    }

    #[test]
    fn the_ratio_is_the_median_round_and_the_spread_its_interquartile_range_over_it() {
        let (ratio, spread) = ratio_and_spread(&[0.5, 0.4, 0.6, 0.45, 0.55, 0.1, 0.9, 0.5]);
        assert_eq!(ratio, 0.5);
        // Sorted: 0.1 0.4 0.45 0.5 0.5 0.55 0.6 0.9; quartiles at 2 and 6.
        assert!((spread - (0.6 - 0.45) / 0.5).abs() < 1e-9, "{spread}");
    }
}
